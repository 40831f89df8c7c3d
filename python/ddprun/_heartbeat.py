"""The implementation of ddprun's worker API (the package's __init__.py exports its public names).

It speaks the C++ SDK's channel and grammar (docs/heartbeat.md): "RANK STEP[ section=NAME][ time=S]"
messages on the worker's end of its channel to the agent, the socket inherited as the descriptor
named by DDPRUN_HEARTBEAT_FD, or, for a process that did not inherit it, datagrams to the unix
socket named by DDPRUN_HEARTBEAT_SOCKET ('@' starts an abstract name). No call ever blocks or
raises into training: a message the agent cannot take now is dropped, and the next one tries
again. Standard library only: every training script imports this.
"""

import atexit
import contextlib
import os
import re
import socket
import threading
import time

# The grammar's bounds (docs/heartbeat.md, common/heartbeat_message.h): the same in libddp and the agent.
_MAX_SECTION = 64
_MAX_STEP_SECONDS = 86400.0
_SECTION_CHARS = re.compile(r"[^A-Za-z0-9._:-]")


def _clean_section(name):
    """A section name as one token of the grammar: other characters become '_', at most 64."""
    return _SECTION_CHARS.sub("_", str(name))[:_MAX_SECTION] or "_"


def _clean_seconds(seconds):
    """A step time within the grammar's bounds (finite, 0 to 86400), or None."""
    try:
        seconds = float(seconds) if seconds is not None else None
    except (TypeError, ValueError):
        return None
    if seconds is not None and not 0 <= seconds <= _MAX_STEP_SECONDS:
        return None  # NaN fails both comparisons
    return seconds


def _format(rank, step, section, seconds):
    """The canonical datagram (tests/data/heartbeat_golden.tsv): section and seconds already clean."""
    text = "%d %d" % (rank, step)
    if section is not None:
        text += " section=" + section
    if seconds is not None:
        text += " time=%.6f" % seconds
    return text + "\n"


def _inherited_channel():
    """Our own descriptor of the channel's end named by DDPRUN_HEARTBEAT_FD, or None when the
    variable is unset or names no unix packet socket here (a process that did not inherit it: a
    child started with close_fds, whose same number may be any other file)."""
    value = os.environ.get("DDPRUN_HEARTBEAT_FD", "")
    if not value.isdigit():
        return None
    try:
        fd = os.dup(int(value))
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # not a socket
        os.close(fd)
        return None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
        sock.close()
        return None
    return sock


class _Channel:
    """The socket of this process (made again after a fork: a child must not share its parent's)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = None
        self._sock = None
        self._address = None
        self._rank = None
        self.step = -1
        self.sections = []  # the sections entered and not left, innermost last
        # Beats closer than this are not sent (as libddp's Heartbeat: a datagram and a wake-up of
        # the agent per millisecond step would cost the step; hang bounds are seconds). Section
        # changes always go. The step times of skipped beats go, averaged, with the next one.
        self.min_interval = 0.1
        self._last_sent = None
        self._last_section = None
        self._time_sum = 0.0
        self._time_count = 0
        self._pending = False  # a beat was thinned since the last one sent: flush() sends it

    def _open(self):
        name = os.environ.get("DDPRUN_HEARTBEAT_SOCKET", "")
        rank = os.environ.get("RANK", "")
        if not rank.isdigit():
            return False
        inherited = _inherited_channel()
        if inherited is not None:  # connected: no address
            self._sock, self._address, self._rank = inherited, None, int(rank)
            return True
        if not name:
            return False
        address = "\0" + name[1:] if name.startswith("@") else name
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
        except OSError:
            return False
        self._sock, self._address, self._rank = sock, address, int(rank)
        return True

    def ready(self):
        pid = os.getpid()
        if self._pid != pid:  # first use, or a forked child (a DataLoader worker): start afresh
            if self._sock is not None:
                try:
                    self._sock.close()
                except OSError:
                    pass
            self._sock = None
            self._pid = pid
            self._open()
        return self._sock is not None

    def send(self, seconds=None):
        """One heartbeat with the current step and section (and the step's compute time, when
        given), unless the last went out less than min_interval ago in the same section; never
        raises, never blocks."""
        with self._lock:
            try:
                if not self.ready():
                    return
                if seconds is not None:
                    self._time_sum += seconds
                    self._time_count += 1
                current = self.sections[-1] if self.sections else None
                now = time.monotonic()
                if (self._last_sent is not None and current == self._last_section
                        and now - self._last_sent < self.min_interval):
                    self._pending = True
                    return
                self._send_now(now, current)
            except (OSError, ValueError):
                pass  # no agent listening yet, a full queue, a socket gone: the next beat tries again

    def flush(self):
        """Sends the last thinned beat, if any (at exit: the steps of a short attempt count for
        --stop_without_progress). Never raises."""
        with self._lock:
            try:
                if self._pending and self._pid == os.getpid() and self._sock is not None:
                    self._send_now(time.monotonic(), self.sections[-1] if self.sections else None)
            except (OSError, ValueError):
                pass

    def _send_now(self, now, current):
        """Sends the beat (the caller holds the lock and catches OSError)."""
        self._pending = False
        self._last_sent, self._last_section = now, current
        seconds = None
        if self._time_count:
            seconds = self._time_sum / self._time_count
            self._time_sum, self._time_count = 0.0, 0
        data = _format(self._rank, max(self.step, 0), current, seconds).encode()
        if self._address is None:
            # MSG_NOSIGNAL: the agent gone is an error here, not a SIGPIPE (a script may have
            # restored its default action).
            self._sock.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        else:
            self._sock.sendto(data, self._address)


_channel = _Channel()


@atexit.register
def _flush_at_exit():
    _channel.flush()


def enabled():
    """Whether heartbeats go anywhere: under ddprun with --hang_timeout (this process)."""
    with _channel._lock:
        try:
            return _channel.ready()
        except Exception:  # noqa: BLE001  (never raise into training)
            return False


def heartbeat(step=None):
    """This rank makes progress. `step`: the training step it reached (kept for later beats)."""
    _beat(step, None)


def report_step(step, seconds=None):
    """This rank finished `step`: a heartbeat that carries the step. `seconds`: the rank's own
    work in the step (data, forward, backward, optimizer; not the time it waited for its peers),
    from which the agent finds stragglers: ranks well above the others' median."""
    _beat(step, seconds)


def _beat(step, seconds):
    try:
        if step is not None:
            _channel.step = int(step)
    except (TypeError, ValueError):
        pass
    _channel.send(_clean_seconds(seconds))


@contextlib.contextmanager
def section(name):
    """A named phase (a checkpoint, an evaluation): beats on entry and on exit, and a rank declared
    hung inside it is reported with the section's name. Sections nest."""
    clean = _clean_section(name)
    _channel.sections.append(clean)
    _channel.send()
    try:
        yield
    finally:
        if _channel.sections and _channel.sections[-1] == clean:
            _channel.sections.pop()
        _channel.send()
