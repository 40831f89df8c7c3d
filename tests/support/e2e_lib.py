"""Shared helpers for ddprun's end-to-end tests (standard library only; torch is imported by the
tests that need it, never here).

Every launcher run gets:
  - a clean environment: the contract variables a launcher sets are removed from what it
    inherits (OMP_NUM_THREADS, NCCL_ASYNC_ERROR_HANDLING, RANK, PET_*, ...), so defaults show;
  - TMPDIR inside the test's own temporary folder, so both launchers' run folders (torchrun's
    torchelastic_*, ddprun's ddprun_*) are created there and removed with it;
  - PYTHON_EXEC (the interpreter that has torch), for ddprun and, identically, for torchrun;
  - a marker variable E2E_MARKER=<uuid> that every worker inherits, so /proc/*/environ tells
    whether any process of the job outlived the launcher.
The launcher's stdout and stderr go to files, never pipes, so a leaked worker cannot hang a test.
"""

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKERS = os.path.join(REPO, "tests", "e2e", "workers")
import ports  # noqa: E402
EXAMPLES = os.path.join(REPO, "examples", "torch")
DDP_TRAIN = os.path.join(EXAMPLES, "ddp_train.py")

BIN_DIR = os.environ.get("DDPRUN_BIN") or os.path.join(REPO, "build", "bin")
DDPRUN = os.path.join(BIN_DIR, "ddprun")
PYTHON_EXEC = os.environ.get("PYTHON_EXEC") or "/usr/bin/python3"
# The torchrun of PYTHON_EXEC's torch (Debian's 1.13, or the torch 2.x tier's), the peer ddprun is
# compared with.
TORCHRUN = [PYTHON_EXEC, "-m", "torch.distributed.run"]


@functools.lru_cache(maxsize=None)
def torch_version(python=PYTHON_EXEC):
    """The version of `python`'s torch, read from its metadata (no import of torch: milliseconds)."""
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True, timeout=60)
    return out.stdout.strip()


# Debian's torchrun 1.13 under Python 3.11 crashes on its default `--redirects 0`
# (pytorch/pytorch#92319); a map that names a local rank that does not exist leaves every real
# rank's output alone. torch 2.x needs nothing.
TORCHRUN_QUIRK_FLAGS = ["--redirects", "9:1", "--tee", "9:1"] if torch_version().startswith("1.") else []

MARKER = "E2E_MARKER"
RUN_TIMEOUT_S = 90

# Variables a launcher sets for its workers; none may leak in from the test's own environment.
_SCRUB = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
          "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
          "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES",
          "LOGLEVEL")
# SLURM_: inside a Slurm job ddprun would take its flags from the step (README: Slurm).
_SCRUB_PREFIXES = ("PET_", "TORCHELASTIC_", "DDPRUN_", "SLURM_")


def worker(name):
    return os.path.join(WORKERS, name)


def free_port():
    return ports.free_port()  # outside every range the kernel or ddprun picks from: scripts/ports.py says why


class RunResult:
    def __init__(self, argv, returncode, stdout, stderr, wall_s, leaked):
        self.argv, self.returncode, self.stdout, self.stderr = argv, returncode, stdout, stderr
        self.wall_s, self.leaked = wall_s, leaked

    def describe(self):
        return "command: %s\nexit: %s after %.1fs\n--- stdout (tail) ---\n%s\n--- stderr (tail) ---\n%s" % (
            " ".join(self.argv), self.returncode, self.wall_s, self.stdout[-4000:], self.stderr[-4000:])


def _processes_with(marker_value):
    needle = ("%s=%s" % (MARKER, marker_value)).encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open("/proc/%s/cmdline" % name, "rb") as c:
                        found.append("%s %s" % (name, c.read().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            pass
    return found


class Launcher:
    """Runs torchrun and ddprun with a clean environment whose TMPDIR lies under `tmp`."""

    def __init__(self, tmp):
        self.tmp = tmp

    def base_env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if k not in _SCRUB and not k.startswith(_SCRUB_PREFIXES)}
        tmpdir = os.path.join(self.tmp, "tmpdir")
        os.makedirs(tmpdir, exist_ok=True)
        env.update(TMPDIR=tmpdir, PYTHON_EXEC=PYTHON_EXEC, PYTHONDONTWRITEBYTECODE="1")
        env.update(extra)
        return env

    def launch(self, argv, env=None, timeout=RUN_TIMEOUT_S):
        """Runs argv to completion (killing its process group after `timeout`) and returns a
        RunResult; `leaked` lists the job's processes still alive one second after it ended."""
        env = dict(env if env is not None else self.base_env())
        marker = uuid.uuid4().hex
        env[MARKER] = marker
        tag = uuid.uuid4().hex[:8]
        out_path = os.path.join(self.tmp, "out_%s.txt" % tag)
        err_path = os.path.join(self.tmp, "err_%s.txt" % tag)
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    cwd=self.tmp, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = "timeout after %ds" % timeout
        wall = time.monotonic() - start
        leaked = []
        deadline = time.monotonic() + 1.0
        while True:
            leaked = _processes_with(marker)
            if not leaked or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for line in leaked:  # never leave them behind for the next test, whatever happened
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        with open(out_path, errors="replace") as f:
            stdout = f.read()
        with open(err_path, errors="replace") as f:
            stderr = f.read()
        sys.stderr.write("  [e2e] %.1fs exit %s: %s\n" % (wall, rc, " ".join(os.path.basename(a) if i == 0 else a
                                                                     for i, a in enumerate(argv))))
        return RunResult(argv, rc, stdout, stderr, wall, leaked)

    def ddprun(self, flags, program, args=(), env=None, timeout=RUN_TIMEOUT_S):
        return self.launch([DDPRUN] + list(flags) + [program] + list(args), env, timeout)

    def torchrun(self, flags, program, args=(), env=None, timeout=RUN_TIMEOUT_S):
        return self.launch(TORCHRUN + TORCHRUN_QUIRK_FLAGS + list(flags) + [program] + list(args), env, timeout)


def check_binaries():
    """Returns what is missing, or None; tests fail (never skip) on it."""
    if not os.access(DDPRUN, os.X_OK):
        return "ddprun not built at %s (set DDPRUN_BIN)" % DDPRUN
    if not torch_version():
        return "no torch for %s (PYTHON_EXEC), so no torchrun to compare with" % PYTHON_EXEC
    return None


class E2ETestCase(unittest.TestCase):
    """Gives each test a temporary folder (removed afterwards) and launcher helpers."""

    maxDiff = None

    def setUp(self):
        missing = check_binaries()
        self.assertIsNone(missing, missing)
        self.tmp = tempfile.mkdtemp(prefix="ddprun_e2e_")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.launcher = Launcher(self.tmp)
        self.base_env = self.launcher.base_env
        self.launch = self.launcher.launch
        self.ddprun = self.launcher.ddprun
        self.torchrun = self.launcher.torchrun

    def assertSucceeded(self, result):
        self.assertEqual(result.returncode, 0, result.describe())
        self.assertEqual(result.leaked, [], "processes outlived the launcher\n" + result.describe())


def main():
    """unittest's main with honest skips (tests/unittest_main.py): a skipped test is listed as
    SKIPPED with its reason, never counted as passed."""
    import unittest_main
    unittest_main.main()


def read_json(path):
    with open(path) as f:
        return json.load(f)


def summary_block(stderr):
    """The failure summary ddprun prints (the lines from '... FAILED' to the closing rule)."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if re.search(r"\bFAILED\b", line):
            block = []
            for rest in lines[i:]:
                block.append(rest)
                if len(block) > 1 and re.fullmatch(r"=+", rest.strip()):
                    break
            return "\n".join(block)
    return ""
