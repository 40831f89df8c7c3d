"""In-process recovery for torch.distributed training scripts (`ddprun --recovery=in_process`).

    import ddprun.recovery as recovery

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = recovery.State(model=model, optimizer=optimizer, rng=True)

    def train(ctx: recovery.Context) -> None:
        ddp = DDP(model)                      # built per round: a DDP keeps the group it was made with
        for step in range(ctx.step, steps):   # ctx.step: the steps done (0 on a fresh job)
            ...                               # forward, backward, optimizer.step()
            ctx.commit(step + 1)              # step + 1 steps done: a beat, and the round's end if told

    recovery.run(train, state)

When a rank of the job dies, the survivors keep their processes (and their memory: the model,
the optimizer, the data loader's workers); ddprun starts a replacement process for the failed rank,
forms a new round and tells each survivor, on the channel its heartbeats go out on
(DDPRUN_HEARTBEAT_FD, docs/heartbeat.md), its rank, world and master of the new round. `run` then
tears the old process group down, applies the new round's environment, initializes a new group,
brings every rank to the state of the rank that got furthest (the lowest rank among those with the
highest committed step broadcasts `state.state_dict()`; the others `load_state_dict` it), and calls
`train` again from that step. One line on stderr per recovery:

    ddprun.recovery: rank N: round R (restart C): <reason>; resuming at step S from rank K

`state` is any object with `state_dict()` and `load_state_dict(d)`: a torch.nn.Module or a
torch.optim.Optimizer qualifies, and `State(**objects)` bundles several of them with plain values
(and, with rng=True, torch's, CUDA's, Python's and, when imported, NumPy's random states). What
it holds is what a replacement gets: the model, the optimizer, and whatever says where the data
stands (a step-seeded data order needs nothing more). Wrap the model in DistributedDataParallel
inside `train`, not outside: the wrapper holds the process group it was built with, which a
recovery replaces. The state that crosses is the state at the last commit(): commit once the
step's optimizer update is done.

Outside ddprun (torchrun, plain python: no channel), `run` initializes the group, calls `train`
once and destroys the group; an exception ends the process as it would without `run`. Under
ddprun without --recovery=in_process no notice comes: a failed rank ends its process after
`notice_timeout_s` at most (the agent stops the others as for any failure).

Standard library only at import (torch is imported when `run` is called); the beat writer is
ddprun._heartbeat's, which adds the token `recoverable=1` to every beat while `run` runs.
"""

import dataclasses
import gc
import os
import random
import select
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from ddprun import _heartbeat

__all__ = ["Context", "RoundOver", "State", "run"]

T = TypeVar("T")

# The notice's bounds and keys (the agent's side writes to the same).
_MAX_NOTICE = 1024
_KEYWORD = "recover"
_INT_KEYS = ("round", "restart", "rank", "world", "local_rank", "master_port")
_REQUIRED = _INT_KEYS + ("master_addr",)
_RECOVERABLE_TOKEN = "recoverable=1"
_FAILED_TOKEN = "failed=1"

# What a rank's exception says when a peer failed, not this rank: gloo's and the store's words for a
# connection a dead peer closed, a collective's timeout, and our own RoundOver. Any other exception
# is this rank's own failure: it tells the agent at once (a beat with failed=1), which ends it and
# recovers it, instead of its peers waiting out their collectives' timeout.
_PEER_FAILURE_WORDS = ("connection closed", "connection reset", "broken pipe", "timed out", "timeout",
                       "connection refused", "socket", "gloo", "nccl", "peer", "round over")


def _peer_failure(error: BaseException) -> bool:
    if isinstance(error, RoundOver):
        return True
    text = ("%s %s" % (type(error).__name__, error)).lower()
    return any(word in text for word in _PEER_FAILURE_WORDS)


def _in_process_mode() -> bool:
    """Whether the agent recovers ranks in place (ddprun --recovery=in_process sets DDPRUN_RECOVERY)."""
    return os.environ.get("DDPRUN_RECOVERY") == "in_process"


class RoundOver(Exception):
    """Raised by Context.commit() when ddprun has announced a new round: the training function
    unwinds at a step boundary and run() starts the new round. Let it through (an `except
    Exception` in the training loop must re-raise it)."""


@dataclasses.dataclass(frozen=True)
class _Notice:
    """One "recover ..." message of the agent: the new round this process joins."""

    round: int
    restart: int
    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int
    reason: str = ""
    # "env.NAME=VALUE" tokens: the rest of a rank's contract, for a warm spare that becomes one
    # (only the names in _SPARE_ENV).
    extra_env: Dict[str, str] = dataclasses.field(default_factory=dict)

    def environment(self) -> Dict[str, str]:
        """The variables torch and ddprun read when a group is initialized."""
        return dict(self.extra_env, **{
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart),
            "DDPRUN_ROUND": str(self.round),
        })


# What a notice may set beyond its own keys: the contract variables a warm spare lacks until it
# becomes a rank (the agent sends them as env.NAME=VALUE); nothing else of the process's environment.
_SPARE_ENV = ("LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
              "TORCHELASTIC_ERROR_FILE", "CUDA_VISIBLE_DEVICES")


def _parse_notice(data: bytes) -> Optional[_Notice]:
    """The notice in one message of the agent; None for a message of another kind (a leading
    keyword other than "recover": a later protocol's, ignored). Raises ValueError for a malformed
    notice: over 1024 bytes, not ASCII, a token without '=', a key twice, a required key missing
    or not a decimal number in range. Unknown keys are skipped; "reason=" takes the rest."""
    if len(data) > _MAX_NOTICE:
        raise ValueError("notice over %d bytes" % _MAX_NOTICE)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("notice not ASCII") from None
    text = text.strip()
    keyword, _, rest = text.partition(" ")
    if keyword != _KEYWORD:
        return None
    reason = ""
    head, sep, tail = (" " + rest).partition(" reason=")
    if sep:
        reason = tail.strip()
    fields: Dict[str, str] = {}
    extra_env: Dict[str, str] = {}
    for token in head.split():
        key, eq, value = token.partition("=")
        if not eq or not key:
            raise ValueError("token %r is not key=value" % token)
        if key in fields:
            raise ValueError("key %r given twice" % key)
        if key.startswith("env.") and key[4:] in _SPARE_ENV:
            extra_env[key[4:]] = value
            continue
        fields[key] = value
    missing = [k for k in _REQUIRED if k not in fields]
    if missing:
        raise ValueError("missing " + ", ".join(missing))
    numbers: Dict[str, int] = {}
    for key in _INT_KEYS:
        value = fields[key]
        if not value.isdigit() or len(value) > 10:
            raise ValueError("%s=%r is not a number" % (key, value))
        numbers[key] = int(value)
    if numbers["world"] < 1 or numbers["rank"] >= numbers["world"]:
        raise ValueError("rank %d not in a world of %d" % (numbers["rank"], numbers["world"]))
    if not 1 <= numbers["master_port"] <= 65535:
        raise ValueError("master_port %d out of range" % numbers["master_port"])
    addr = fields["master_addr"]
    if not addr or not addr.isprintable():
        raise ValueError("master_addr %r" % addr)
    return _Notice(round=numbers["round"], restart=numbers["restart"], rank=numbers["rank"],
                   world=numbers["world"], local_rank=numbers["local_rank"], master_addr=addr,
                   master_port=numbers["master_port"], reason=reason, extra_env=extra_env)


def _warn(message: str) -> None:
    try:
        sys.stderr.write("ddprun.recovery: %s\n" % message)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _current_round() -> Optional[int]:
    value = os.environ.get("DDPRUN_ROUND", "")
    return int(value) if value.isdigit() else None


class _NoticeReader:
    """The agent's messages on this process's channel: our own duplicate of DDPRUN_HEARTBEAT_FD,
    read by the process that opened it only (a forked DataLoader worker holds the descriptor too
    and must not take a notice meant for its parent)."""

    def __init__(self, sock: Optional[socket.socket]) -> None:
        self._sock = sock
        self._pid = os.getpid()
        self._closed = sock is None  # end-of-file seen (the agent gone), or no channel at all

    @classmethod
    def open(cls) -> "_NoticeReader":
        """The reader of the inherited channel; one that never has a notice outside ddprun."""
        return cls(_heartbeat._inherited_channel())

    def available(self) -> bool:
        """Whether notices can come: a channel, read by the process that opened it, not at EOF."""
        return not self._closed and self._pid == os.getpid()

    def close(self) -> None:
        if self._sock is not None and self._pid == os.getpid():
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._closed = True

    def _take(self, latest: Optional[_Notice]) -> Optional[_Notice]:
        """Reads every message pending now (never blocks); returns the newest valid notice among
        them, else `latest`. Malformed notices and stale ones (a round not above DDPRUN_ROUND)
        are dropped with a warning."""
        while self.available() and self._sock is not None:
            try:
                data = self._sock.recv(4096, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                _warn("channel error %s: no more notices" % e)
                self._closed = True
                break
            if not data:  # SOCK_SEQPACKET: end-of-file (the agent never sends an empty message)
                self._closed = True
                break
            try:
                notice = _parse_notice(data)
            except ValueError as e:
                _warn("malformed notice ignored (%s): %r" % (e, data[:200]))
                continue
            if notice is None:
                continue
            current = _current_round()
            if current is not None and notice.round <= current:
                _warn("stale notice ignored (round %d, this process is in round %d)" % (notice.round, current))
                continue
            latest = notice
        return latest

    def poll(self) -> Optional[_Notice]:
        """The newest notice pending now, or None; never blocks."""
        return self._take(None)

    def wait(self, timeout_s: float, latest: Optional[_Notice] = None) -> Optional[_Notice]:
        """Waits up to `timeout_s` for a notice (returning at once with `latest` or one pending);
        then the newest of all pending. Beats once a second meanwhile (this rank is alive)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        latest = self._take(latest)
        while latest is None and self.available() and self._sock is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            poller = select.poll()
            poller.register(self._sock.fileno(), select.POLLIN)
            try:
                poller.poll(int(min(left, 1.0) * 1000) + 1)
            except InterruptedError:
                pass
            _heartbeat.heartbeat()
            latest = self._take(latest)
        return latest


class State:
    """Several objects with state_dict()/load_state_dict() (a Module, an Optimizer, an LR
    scheduler, a GradScaler, a sampler of yours) and plain picklable values, as one state.

        state = State(model=model, optimizer=optimizer, epoch=0, rng=True)
        state.epoch += 1        # plain values are attributes, replaced by load_state_dict

    rng=True adds the random states: torch's CPU generator, every CUDA device's (when CUDA is
    initialized), Python's `random` and NumPy's global one (when numpy is imported). After a
    recovery every rank has the source rank's: seed per rank and step where ranks must differ.
    """

    def __init__(self, rng: bool = False, **objects: Any) -> None:
        object.__setattr__(self, "_objects", dict(objects))
        object.__setattr__(self, "_rng", bool(rng))

    def __getattr__(self, name: str) -> Any:
        objects = object.__getattribute__(self, "_objects")
        if name in objects:
            return objects[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._objects[name] = value

    @staticmethod
    def _stateful(value: Any) -> bool:
        return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))

    def state_dict(self) -> Dict[str, Any]:
        """{name: obj.state_dict() or the plain value}, plus "_rng" with rng=True."""
        out: Dict[str, Any] = {}
        for name, value in self._objects.items():
            out[name] = value.state_dict() if self._stateful(value) else value
        if self._rng:
            out["_rng"] = _rng_state()
        return out

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads each object's part (load_state_dict) and replaces the plain values."""
        for name, value in state_dict.items():
            if name == "_rng":
                if self._rng:
                    _set_rng_state(value)
                continue
            current = self._objects.get(name)
            if current is not None and self._stateful(current):
                current.load_state_dict(value)
            else:
                self._objects[name] = value


def _rng_state() -> Dict[str, Any]:
    import torch

    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    import torch

    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
    numpy = sys.modules.get("numpy")
    if "numpy" in state and numpy is not None:
        numpy.random.set_state(state["numpy"])


class Context:
    """What train(ctx) is given: this round's place of the process, the step to start from, and
    commit().

    rank, local_rank, world_size: this round's (they may differ from the last round's).
    step: the steps done before this round (the step to start from; 0 on a fresh job).
    restart_count: TORCHELASTIC_RESTART_COUNT of the round (0 before any recovery or restart).
    round: DDPRUN_ROUND (None outside ddprun).
    """

    def __init__(self, runner: "_Runner", rank: int, local_rank: int, world_size: int, step: int,
                 restart_count: int, round: Optional[int]) -> None:
        self._runner = runner
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.step = step
        self.restart_count = restart_count
        self.round = round

    def commit(self, step: int) -> None:
        """`step` steps are done and the state holds them: the state a recovery starts from.

        Sends a heartbeat carrying the step (as ddprun.report_step, with recoverable=1), then
        checks, without blocking, whether ddprun announced a new round: if so raises RoundOver,
        which run() catches to start it. Costs one beat and one non-blocking receive.
        """
        self._runner.committed = int(step)
        _heartbeat.report_step(step)
        self._runner.check()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


_graveyard: List[Any] = []  # old default groups whose teardown did not finish: never destroyed here


def _run_bounded(fn: Callable[[], Any], timeout_s: float, name: str) -> bool:
    """Runs fn in a daemon thread; whether it finished (raising or not) within timeout_s."""
    done = threading.Event()

    def body() -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001  (a teardown's error is no reason to stop)
            _warn("%s: %s: %s" % (name, type(e).__name__, e))
        finally:
            done.set()

    threading.Thread(target=body, daemon=True, name="ddprun-recovery-" + name).start()
    return done.wait(max(0.0, timeout_s))


def _forget_default_group(dist: Any) -> None:
    """Resets torch's default-group bookkeeping so that init_process_group can run again, for a
    group whose destroy_process_group did not finish (1.13's module globals, 2.x's _world)."""
    c10d = dist.distributed_c10d
    world_pg = getattr(getattr(c10d, "GroupMember", None), "WORLD", None)
    if world_pg is not None:
        _graveyard.append(world_pg)
    try:
        if hasattr(c10d, "_update_default_pg"):
            c10d._update_default_pg(None)
    except Exception:  # noqa: BLE001
        pass
    world = getattr(c10d, "_world", None)
    containers = [getattr(c10d, n, None) for n in ("_pg_map", "_pg_names", "_pg_group_ranks")]
    if world is not None:
        containers += [getattr(world, n, None) for n in (
            "pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag", "tags_to_pg",
            "pg_coalesce_state", "pg_flight_recorder_hooks")]
    for container in containers:
        try:
            if container is not None and hasattr(container, "clear"):
                container.clear()
        except Exception:  # noqa: BLE001
            pass
    for owner, name in ((world, "group_count"), (c10d, "_group_count")):
        try:
            if owner is not None and hasattr(owner, name):
                setattr(owner, name, 0)
        except Exception:  # noqa: BLE001
            pass
    try:
        if hasattr(c10d, "_default_pg_init_method"):
            c10d._default_pg_init_method = None
        if hasattr(c10d, "_unregister_all_process_groups"):
            c10d._unregister_all_process_groups()
    except Exception:  # noqa: BLE001
        pass
    try:
        if getattr(c10d.GroupMember, "WORLD", None) is not None:
            c10d.GroupMember.WORLD = None
    except Exception:  # noqa: BLE001
        pass


def _teardown(dist: Any, timeout_s: float) -> None:
    """Destroys the default group within timeout_s; else aborts it where torch can and forgets it."""
    if not dist.is_initialized():
        return
    if _run_bounded(dist.destroy_process_group, timeout_s, "destroy") and not dist.is_initialized():
        return
    _warn("the old process group did not shut down within %.0f s; abandoning it" % timeout_s)
    c10d = dist.distributed_c10d
    if dist.is_initialized():
        if hasattr(c10d, "_abort_process_group"):
            _run_bounded(c10d._abort_process_group, min(timeout_s, 10.0), "abort")
        else:
            pg = getattr(c10d.GroupMember, "WORLD", None)
            if pg is not None and hasattr(pg, "abort"):
                _run_bounded(pg.abort, min(timeout_s, 10.0), "abort")
    if dist.is_initialized():
        _forget_default_group(dist)


def _sync(dist: Any, state: Any, committed: int) -> Tuple[int, int]:
    """Every rank's committed step; the lowest rank with the highest broadcasts its state and
    step, which the others load. Returns (step, source rank)."""
    import torch

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    world = dist.get_world_size()
    mine = torch.tensor([committed], dtype=torch.int64, device=device)
    gathered = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine)
    steps = [int(t.item()) for t in gathered]
    best = max(steps)
    source = steps.index(best)
    objects: List[Any] = [state.state_dict(), best] if dist.get_rank() == source else [None, None]
    dist.broadcast_object_list(objects, src=source)
    if dist.get_rank() != source:
        state.load_state_dict(objects[0])
    return int(objects[1]), source


# Where the main thread is while it waits on its peers: torch's collectives, DDP, autograd (DDP's
# all-reduce runs inside backward), the process group's set-up. Paths as in a frame's co_filename.
_WAITING_IN = tuple(os.sep + os.path.join("torch", *parts) + os.sep for parts in
                    (("distributed",), ("nn", "parallel"), ("autograd",)))


def _in_torch_wait(frame: Any) -> bool:
    """Whether a frame of this stack runs in torch's collectives, DDP or autograd."""
    depth = 0
    while frame is not None and depth < 200:
        name = frame.f_code.co_filename
        if any(part in name for part in _WAITING_IN):
            return True
        frame = frame.f_back
        depth += 1
    return False


class _WaitBeats:
    """While the main thread sits in a torch.distributed call (waiting on its peers), a daemon
    thread beats for it once a second, with the step unchanged: a rank that waits on a hung peer is
    alive, and only the rank hung in its own code falls silent, so that --hang_timeout names the
    rank to replace (the others are stuck only because of it). A rank stuck inside a collective
    itself (all of them, say, on a stuck device) is then ended by the group's timeout (timeout_s)."""

    def __init__(self, period_s: float = 1.0) -> None:
        self._main = threading.main_thread().ident
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddprun-recovery-beats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                frame = sys._current_frames().get(self._main)  # noqa: SLF001 (the stdlib's way)
                if frame is not None and _in_torch_wait(frame):
                    _heartbeat._channel.send(force=True)
                del frame
            except Exception:  # noqa: BLE001  (a beat never breaks training)
                pass


class _Runner:
    """run()'s loop state: the channel, the committed step, a notice already taken."""

    def __init__(self, reader: _NoticeReader) -> None:
        self.reader = reader
        self.committed = 0
        self.notice: Optional[_Notice] = None

    def check(self) -> None:
        """Raises RoundOver when a notice is pending (kept in self.notice)."""
        if not self.reader.available():
            return
        notice = self.reader.poll()
        if notice is not None:
            self.notice = notice
            raise RoundOver("round %d announced: %s" % (notice.round, notice.reason))


def _drop_tracebacks(error: BaseException) -> None:
    """Clears the tracebacks of an exception and of those it was raised from or during."""
    seen = set()
    current: Optional[BaseException] = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


def _apply(notice: _Notice) -> None:
    """Sets the new round's environment; the beats name the new rank."""
    os.environ.update(notice.environment())
    channel = _heartbeat._channel
    with channel._lock:
        if channel._rank is not None:
            channel._rank = notice.rank


def _wait_as_spare(reader: "_NoticeReader") -> Optional[_Notice]:
    """A warm spare (ddprun --spares_per_node sets DDPRUN_SPARE=1): the script ran up to here, its
    imports done; it waits, not a rank, until the agent makes it one (a notice), and returns it.
    None when the agent is gone (the channel closed)."""
    while True:
        notice = reader.wait(3600.0)
        if notice is not None:
            return notice
        if not reader.available():
            return None


def run(train: Callable[[Context], T], state: Any, *, backend: str = "gloo", timeout_s: float = 30.0,
        notice_timeout_s: float = 60.0) -> T:
    """Runs train(ctx) under in-process recovery; returns what train returns.

    Initializes the default process group (`backend`, env://, `timeout_s` for its collectives),
    brings every rank to the state of the rank with the most committed steps (`state`: any object
    with state_dict() and load_state_dict(); see State), calls train(ctx) (a Context), and
    destroys the group when train returns.

    When train, the initialization or the state sync raises (a peer died: gloo's "Connection
    closed by peer"; or RoundOver from ctx.commit()), waits up to `notice_timeout_s` for ddprun's
    notice of a new round. With one, tears the old group down (bounded by `timeout_s`), sets RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT and DDPRUN_ROUND
    as the notice says, and starts over, keeping this process's committed step and state.
    Without one (or outside ddprun) re-raises the exception: the process fails as without run().
    """
    import torch.distributed as dist

    reader = _NoticeReader.open()
    runner = _Runner(reader)
    channel = _heartbeat._channel
    saved_extra = channel.extra
    # A recovery's gc.collect() frees the failed round's DDP (its hooks hold the old group). What
    # exists now (torch's own objects, the model) lives as long as the process: frozen, the
    # collector skips it, and that collect costs milliseconds instead of 0.2-0.3 s on torch 2.x
    # (measured: bench/RESULTS_RECOVERY.md). Unfrozen when run() returns.
    gc.freeze()
    if os.environ.get("DDPRUN_SPARE") == "1" and reader.available():
        activated = _wait_as_spare(reader)
        if activated is None:
            raise SystemExit("ddprun.recovery: a spare whose agent is gone")
        _apply(activated)
        del os.environ["DDPRUN_SPARE"]
        with channel._lock:
            channel._rank = activated.rank
        _warn("spare became rank %d in round %d (restart %d): %s" % (
            activated.rank, activated.round, activated.restart, activated.reason or "-"))
    waiting: Optional[_WaitBeats] = None
    if reader.available():
        channel.extra = saved_extra + (_RECOVERABLE_TOKEN,)
        channel.step = max(channel.step, 0)
        channel.send(force=True)  # opt in at once
        if _in_process_mode():
            waiting = _WaitBeats()
            waiting.start()
    recovered: Optional[_Notice] = None
    try:
        while True:
            try:
                dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
                step, source = _sync(dist, state, runner.committed)
                runner.committed = step
                if recovered is not None:
                    _warn("rank %d: round %d (restart %d): %s; resuming at step %d from rank %d" % (
                        recovered.rank, recovered.round, recovered.restart, recovered.reason or "-", step, source))
                    recovered = None
                ctx = Context(runner, rank=dist.get_rank(), local_rank=_env_int("LOCAL_RANK", 0),
                              world_size=dist.get_world_size(), step=step,
                              restart_count=_env_int("TORCHELASTIC_RESTART_COUNT", 0), round=_current_round())
                result = train(ctx)
            except Exception as error:  # noqa: BLE001  (judged below: re-raised unless a notice comes)
                if (not reader.available() and runner.notice is None) or not _in_process_mode():
                    raise  # not recovered in place: the rank fails at once, as without run()
                if runner.notice is None and not _peer_failure(error):
                    # This rank's own failure: the agent ends this process and starts another in
                    # its place; its peers are told the next round.
                    channel.extra = saved_extra + (_RECOVERABLE_TOKEN, _FAILED_TOKEN)
                    channel.send(force=True)
                    channel.extra = saved_extra + (_RECOVERABLE_TOKEN,)
                notice = reader.wait(notice_timeout_s, runner.notice)
                runner.notice = None
                if notice is None:
                    raise
                # Drop the failed round's frames (the traceback holds train's locals: a DDP
                # wrapper whose autograd hooks would still use the old group).
                _drop_tracebacks(error)
                del error
            else:
                dist.destroy_process_group()
                return result
            gc.collect()
            _teardown(dist, timeout_s)
            notice = reader.poll() or notice  # a newer one that came during the teardown
            _apply(notice)
            recovered = notice
    finally:
        if waiting is not None:
            waiting.stop()
        channel.extra = saved_extra
        reader.close()
        gc.unfreeze()
