"""Helpers for ddprun's multi-node integration tests (standard library only).

Every "node" is a separate `ddprun` agent process on this machine (or in a network namespace of
its own, see test_netns.py), started with its own leak marker (ddprun_testlib's DDPRUN_LEAKTEST)
so that /proc/*/environ tells which processes belong to which agent. Agents of one job talk over
real sockets: the rendezvous is either embedded in one agent or a `ddprun-rdzv` daemon.

The recording worker (RECORDER) appends one line per start to a file of its own:
    <node tag> <DDPRUN_ROUND> <TORCHELASTIC_RESTART_COUNT> <RANK> <WORLD_SIZE> <GROUP_RANK> <GROUP_WORLD_SIZE>
and then waits (bounded) for a release file, so tests can watch rounds change while a job runs and
then let it end cleanly.
"""

import json
import os
import signal
import socket
import subprocess
import time
import uuid

import ddprun_testlib as tl

import ports  # noqa: E402

RDZV = os.path.join(tl.BIN_DIR, "ddprun-rdzv")
# README "Exit status" (common/exit_codes.h): the infrastructure-failure code. An agent whose
# rendezvous is unreachable or lost, that is fenced out and cannot join again, that is refused (a
# stale round, a closed job) or that runs out of join_timeout exits with it.
EXIT_INFRASTRUCTURE = 200
SAFETY_TIMEOUT_S = tl.SAFETY_TIMEOUT_S
REPO = tl.REPO
DDP_TRAIN = os.path.join(REPO, "examples", "torch", "ddp_train.py")

# Variables a launcher sets for its workers: none may leak in from the environment of the test.
_SCRUB = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
          "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
          "LOGLEVEL", "DDPRUN_RDZV_TOKEN")
_SCRUB_PREFIXES = ("PET_", "TORCHELASTIC_", "DDPRUN_STORE", "DDPRUN_ROUND")

# One line per start of the worker, then: exit EXIT_CODE on node FAIL_NODE, local rank FAIL_LOCAL in
# attempt (TORCHELASTIC_RESTART_COUNT) FAIL_ATTEMPT, once every rank recorded that attempt; else
# wait for the release file (at most HOLD_S seconds) and exit 0.
RECORDER = r"""#!/bin/sh
d="%(d)s"
attempt="$TORCHELASTIC_RESTART_COUNT"
echo "$NODE_TAG $DDPRUN_ROUND $attempt $RANK $WORLD_SIZE $GROUP_RANK $GROUP_WORLD_SIZE $MASTER_ADDR $MASTER_PORT" \
  >> "$d/rec_${NODE_TAG}_${LOCAL_RANK}"
if [ "$NODE_TAG" = "%(fail_node)s" ] && [ "$LOCAL_RANK" = "%(fail_local)s" ] && [ "$attempt" = "%(fail_attempt)s" ]; then
  # Fail only once every rank of the world recorded this attempt, so that all of them ran it.
  n=0
  while [ "$(cat "$d"/rec_* 2>/dev/null | awk -v c="$attempt" '$3 == c' | wc -l)" -lt "$WORLD_SIZE" ] \
        && [ $n -lt 400 ]; do
    sleep 0.05; n=$((n + 1))
  done
  echo "rank $RANK fails in attempt $TORCHELASTIC_RESTART_COUNT" >&2
  exit %(exit_code)d
fi
n=0
limit=$((%(hold_s)d * 20))
while [ ! -e "$d/release" ] && [ $n -lt $limit ]; do
  sleep 0.05; n=$((n + 1))
done
exit 0
"""


def free_port(host="127.0.0.1"):
    return ports.free_port(host)  # outside every range the kernel or ddprun picks from: scripts/ports.py says why


def wait_listening(port, host="127.0.0.1", timeout=10.0, proc=None):
    """True once something accepts TCP connections on host:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def open_file_limits(pid):
    """(soft, hard) limit on open files of process `pid`."""
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no open file limit in /proc/%d/limits" % pid)


def clean_env(extra=None):
    """Changes to the agent's environment (for ddprun_testlib.Job): None unsets a variable."""
    env = {}
    for name in os.environ:
        if name in _SCRUB or name.startswith(_SCRUB_PREFIXES):
            env[name] = None
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


class Proc:
    """A process with an arbitrary argv (ip netns exec ..., ddprun-rdzv), started like
    ddprun_testlib.Job: own session, leak marker, output to files, killed at cleanup."""

    def __init__(self, test, argv, env=None, name="proc"):
        self.test = test
        self.marker = uuid.uuid4().hex
        self.cmd = list(argv)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # as tl.Job
        full_env["PYTHON_EXEC"] = tl.PYTHON_EXEC
        full_env["TMPDIR"] = test.tmp
        for key, value in (env or {}).items():
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = value
        full_env[tl.MARKER_NAME] = self.marker
        self._out_path = os.path.join(test.tmp, "%s_stdout_%s" % (name, self.marker))
        self._err_path = os.path.join(test.tmp, "%s_stderr_%s" % (name, self.marker))
        with open(self._out_path, "wb") as out, open(self._err_path, "wb") as err:
            self.start = time.monotonic()
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=full_env,
                                         cwd=test.tmp, start_new_session=True)
        self.end = None
        test.addCleanup(self.cleanup)

    @property
    def pid(self):
        return self.proc.pid

    def poll(self):
        return self.proc.poll()

    def stdout(self):
        return tl.Job._read(self._out_path)

    def stderr(self):
        return tl.Job._read(self._err_path)

    def wait(self, timeout):
        """Waits for the process to exit; fails the test after `timeout` (a safety timeout)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cleanup()
            self.test.fail("%s did not exit within the %.0fs safety timeout\n%s" % (
                self.cmd[0], timeout, self.result(None).describe()))
        self.end = time.monotonic()
        return self.result(rc)

    def result(self, rc):
        elapsed = (self.end or time.monotonic()) - self.start
        return tl.Result(rc, self.stdout(), self.stderr(), elapsed, self.cmd)

    def survivors(self, grace=tl.LEAK_GRACE_S):
        return tl.survivors_after(self.marker, grace)

    def kill(self, sig=signal.SIGKILL):
        """Signals only this process (not its process group: that is what a crash looks like)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def cleanup(self):
        if self.proc.poll() is None:
            for kill in (lambda: os.killpg(self.proc.pid, signal.SIGKILL), self.proc.kill):
                try:
                    kill()
                except OSError:
                    pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        tl.kill_marked(self.marker)


class Daemon(Proc):
    """A ddprun-rdzv daemon on 127.0.0.1:port (waits until it says it listens)."""

    def __init__(self, test, port, token_file=None, bind="127.0.0.1", prefix=(), log_level="info", extra=()):
        argv = list(prefix) + [RDZV, "--port", str(port), "--bind", bind, "--log_level", log_level] + list(extra)
        if token_file:
            argv += ["--token_file", token_file]
        super().__init__(test, argv, env=clean_env(), name="rdzv")
        deadline = time.monotonic() + 15
        while "listening on" not in self.stdout():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                test.fail("ddprun-rdzv did not start\n%s" % self.result(self.proc.poll()).describe())
            time.sleep(0.02)
        self.port = port


class MultiNodeTestCase(tl.DdprunTestCase):
    """DdprunTestCase plus agents, daemons and the recording worker."""

    def setUp(self):
        super().setUp()
        self.assertTrue(os.access(RDZV, os.X_OK), "ddprun-rdzv not found at %s (set DDPRUN_BIN)" % RDZV)
        self.run_id = "%s_%s" % (self.id().rsplit(".", 1)[-1], uuid.uuid4().hex[:8])

    # --- processes -----------------------------------------------------------------------
    def agent(self, tag, args, env=None, prefix=None):
        """One ddprun agent ("node" `tag`). Workers see NODE_TAG=tag. With `prefix` (a command such
        as ip netns exec NS), the agent runs under it."""
        e = clean_env({"NODE_TAG": tag})
        e.update(env or {})
        return Proc(self, list(prefix or ()) + [tl.DDPRUN] + list(args), env=e, name="agent_" + tag)

    def elastic_args(self, nnodes, port, nproc=1, conf=None, extra=(), host="127.0.0.1", backend="grpc"):
        args = ["--nnodes=%s" % nnodes, "--rdzv_backend=%s" % backend, "--rdzv_endpoint=%s:%d" % (host, port),
                "--rdzv_id=%s" % self.run_id, "--nproc_per_node=%d" % nproc, "--shutdown_timeout=2"]
        if conf:
            args.append("--rdzv_conf=" + conf)
        return args + list(extra)

    def wait_all(self, jobs, timeout):
        """Waits for every job with one shared deadline; returns their results."""
        deadline = time.monotonic() + timeout
        return [j.wait(max(0.1, deadline - time.monotonic())) for j in jobs]

    def describe_all(self, jobs):
        return "\n".join("=== agent %d ===\n%s" % (i, j.result(j.proc.poll()).describe()) for i, j in enumerate(jobs))

    def assert_no_leftovers(self, jobs, grace=tl.LEAK_GRACE_S):
        for j in jobs:
            left = j.survivors(grace)
            self.assertEqual(left, [], "processes of an agent outlived it:\n%s\n%s" % (left, self.describe_all(jobs)))

    # --- the recording worker ------------------------------------------------------------
    def recorder(self, fail_node="-", fail_local=-1, fail_attempt=-1, exit_code=0, hold_s=60):
        return self.script("recorder.sh", RECORDER % {"d": self.tmp, "fail_node": fail_node, "fail_local": fail_local,
                                                      "fail_attempt": fail_attempt, "exit_code": exit_code,
                                                      "hold_s": hold_s})

    def release(self):
        with open(self.path("release"), "w") as f:
            f.write("go\n")

    def records(self):
        """Every worker start so far: dicts with node, round, restart, rank, world, group_rank,
        group_world, master_addr, master_port, local_rank."""
        out = []
        for name in sorted(os.listdir(self.tmp)):
            if not name.startswith("rec_"):
                continue
            local_rank = int(name.rsplit("_", 1)[1])
            with open(self.path(name)) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) != 9:
                        continue  # a line being written
                    out.append(dict(node=parts[0], round=int(parts[1]), restart=int(parts[2]), rank=int(parts[3]),
                                    world=int(parts[4]), group_rank=int(parts[5]), group_world=int(parts[6]),
                                    master_addr=parts[7], master_port=int(parts[8]), local_rank=local_rank))
        return out

    def wait_records(self, predicate, timeout, jobs=(), what="worker records"):
        """Polls the records until predicate(records) is true; returns the time it became true.
        Fails (with every agent's output) on timeout or when an agent exits meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            recs = self.records()
            if predicate(recs):
                return time.monotonic()
            for j in jobs:
                if j.proc.poll() is not None:
                    self.fail("an agent exited (%s) while waiting for %s\nrecords: %s\n%s" % (
                        j.proc.returncode, what, recs, self.describe_all(jobs)))
            if time.monotonic() > deadline:
                self.fail("timed out after %ss waiting for %s\nrecords: %s\n%s" % (
                    timeout, what, recs, self.describe_all(jobs)))
            time.sleep(0.02)


def latest_round(records, node):
    rounds = [r["round"] for r in records if r["node"] == node]
    return max(rounds) if rounds else None


def round_complete(records, round_no, nodes, nproc, world):
    """Every local rank of every node in `nodes` started in round `round_no` with WORLD_SIZE world."""
    got = {(r["node"], r["local_rank"]) for r in records if r["round"] == round_no and r["world"] == world}
    return all((n, lr) in got for n in nodes for lr in range(nproc))


def read_json(path):
    with open(path) as f:
        return json.load(f)
