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
from typing import Any, Iterator, List, Optional, Sequence, Tuple

# The grammar's bounds (docs/heartbeat.md, common/heartbeat_message.h): the same in libddp and the agent.
_MAX_SECTION = 64
_MAX_STEP_SECONDS = 86400.0
_SECTION_CHARS = re.compile(r"[^A-Za-z0-9._:-]")


def _clean_section(name: object) -> str:
    """A section name as one token of the grammar: other characters become '_', at most 64."""
    return _SECTION_CHARS.sub("_", str(name))[:_MAX_SECTION] or "_"


def _clean_seconds(seconds: Any) -> Optional[float]:
    """A step time within the grammar's bounds (finite, 0 to 86400), or None."""
    try:
        value = float(seconds) if seconds is not None else None
    except (TypeError, ValueError):
        return None
    if value is not None and not 0 <= value <= _MAX_STEP_SECONDS:
        return None  # NaN fails both comparisons
    return value


def _format(rank: int, step: int, section: Optional[str], seconds: Optional[float],
            extra: Sequence[str] = ()) -> str:
    """The canonical datagram (tests/data/heartbeat_golden.tsv): section and seconds already clean.
    `extra`: further "key=value" tokens (the grammar's other keys, e.g. ddprun.recovery's
    "recoverable=1"), written last in the order given; none by default (the table's bytes)."""
    text = "%d %d" % (rank, step)
    if section is not None:
        text += " section=" + section
    if seconds is not None:
        text += " time=%.6f" % seconds
    for token in extra:
        text += " " + token
    return text + "\n"


def _inherited_channel() -> Optional[socket.socket]:
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

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: Optional[int] = None
        self._sock: Optional[socket.socket] = None
        self._address: Optional[str] = None
        self._rank: Optional[int] = None
        self.step = -1
        self.sections: List[str] = []  # the sections entered and not left, innermost last
        # Beats closer than this are not sent (as libddp's Heartbeat: a datagram and a wake-up of
        # the agent per millisecond step would cost the step; hang bounds are seconds). Section
        # changes always go. The step times of skipped beats go, averaged, with the next one.
        self.min_interval = 0.1
        self._last_sent: Optional[float] = None
        self._last_section: Optional[str] = None
        self._time_sum = 0.0
        self._time_count = 0
        self._pending = False  # a beat was thinned since the last one sent: flush() sends it
        # Tokens every beat of this process carries after its own (ddprun.recovery sets
        # ("recoverable=1",) while recovery.run() runs): "key=value" each, no spaces.
        self.extra: Tuple[str, ...] = ()

    def _open(self) -> bool:
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

    def ready(self) -> bool:
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

    def send(self, seconds: Optional[float] = None, force: bool = False) -> None:
        """One heartbeat with the current step and section (and the step's compute time, when
        given), unless the last went out less than min_interval ago in the same section (and
        `force` is False); never raises, never blocks."""
        with self._lock:
            try:
                if not self.ready():
                    return
                if seconds is not None:
                    self._time_sum += seconds
                    self._time_count += 1
                current = self.sections[-1] if self.sections else None
                now = time.monotonic()
                if (not force and self._last_sent is not None and current == self._last_section
                        and now - self._last_sent < self.min_interval):
                    self._pending = True
                    return
                self._send_now(now, current)
            except (OSError, ValueError):
                pass  # no agent listening yet, a full queue, a socket gone: the next beat tries again

    def flush(self) -> None:
        """Sends the last thinned beat, if any (at exit: the steps of a short attempt count for
        --stop_without_progress). Never raises."""
        with self._lock:
            try:
                if self._pending and self._pid == os.getpid() and self._sock is not None:
                    self._send_now(time.monotonic(), self.sections[-1] if self.sections else None)
            except (OSError, ValueError):
                pass

    def _send_now(self, now: float, current: Optional[str]) -> None:
        """Sends the beat (the caller holds the lock, found the socket open and catches OSError)."""
        sock, rank = self._sock, self._rank
        if sock is None or rank is None:  # not reached (the callers checked): for the type checker
            return
        self._pending = False
        self._last_sent, self._last_section = now, current
        seconds = None
        if self._time_count:
            seconds = self._time_sum / self._time_count
            self._time_sum, self._time_count = 0.0, 0
        data = _format(rank, max(self.step, 0), current, seconds, self.extra).encode()
        if self._address is None:
            # MSG_NOSIGNAL: the agent gone is an error here, not a SIGPIPE (a script may have
            # restored its default action).
            sock.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        else:
            sock.sendto(data, self._address)


_channel = _Channel()


@atexit.register
def _flush_at_exit() -> None:
    _channel.flush()


def enabled() -> bool:
    """Whether this process's heartbeats reach a ddprun agent.

    True in a worker that ddprun started (it sets DDPRUN_HEARTBEAT_FD and DDPRUN_HEARTBEAT_SOCKET,
    with or without --hang_timeout: the agent always listens) and in the processes it forks or
    starts with that environment; False outside ddprun (plain python, torchrun) or when RANK is
    not a number, and then every call of this package does nothing.

    Costs the module's lock and an os.getpid(); the first call in a process (or after a fork)
    also opens its socket (an os.dup of the inherited channel and a check of its type, or a new
    non-blocking datagram socket), as the first beat would. Sends nothing; never raises.
    """
    with _channel._lock:
        try:
            return _channel.ready()
        except Exception:  # noqa: BLE001  (never raise into training)
            return False


def heartbeat(step: Optional[int] = None) -> None:
    """This rank makes progress.

    `step`: the training step it reached, kept for the beats after; None (or a value int()
    rejects) keeps the last one given (0 before any).

    Costs the module's lock, an os.getpid() and a monotonic clock read, and at most once per
    100 ms one non-blocking send of a message under 128 bytes (one system call): a beat within
    100 ms of the last one sent, in the same section, is held back, and the next one sent carries
    the latest step (the last held one goes at exit). So it can be called every step. Outside
    ddprun (enabled() is False) it costs the lock and the getpid and sends nothing.

    Never blocks and never raises: a message the agent cannot take now (a full queue, the agent
    gone) is dropped, and the next beat tries again.
    """
    _beat(step, None)


def report_step(step: int, seconds: Optional[float] = None) -> None:
    """This rank finished `step`: a heartbeat() that carries the step.

    `seconds`: the rank's own work in the step (data, forward, backward, optimizer; not the time
    it waited for its peers), from which the agent finds stragglers: ranks well above the others'
    median. The beat sent carries the mean of the times given since the last one; a time that is
    not a number from 0 to 86400 is dropped, and the beat still goes.

    Costs, no-ops and guarantees as heartbeat(), plus a float() of `seconds`.
    """
    _beat(step, seconds)


def _beat(step: Any, seconds: Any) -> None:
    try:
        if step is not None:
            _channel.step = int(step)
    except (TypeError, ValueError):
        pass
    _channel.send(_clean_seconds(seconds))


@contextlib.contextmanager
def section(name: str) -> Iterator[None]:
    """A named phase, as a context manager: `with ddprun.section("checkpoint"): save(model)`.

    Beats on entry and on exit; a rank declared hung inside it is reported with the section's
    name, and --hang_timeout=auto learns a bound per section. Sections nest (the innermost names
    the beats); they are one stack per process, not per thread. `name` becomes one token of the
    grammar: characters other than letters, digits and ._:- become '_', cut at 64.

    Costs a regex substitution of the name and two beats as heartbeat()'s, except that a change
    of the innermost section is never held back. Outside ddprun it sends nothing.

    Never blocks, and raises nothing of its own; an exception of the body goes through as from
    any `with`, the section left first.
    """
    clean = _clean_section(name)
    _channel.sections.append(clean)
    _channel.send()
    try:
        yield
    finally:
        if _channel.sections and _channel.sections[-1] == clean:
            _channel.sections.pop()
        _channel.send()
