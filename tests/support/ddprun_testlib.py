"""Shared helpers for ddprun's integration tests (standard library only).

Every job is started with a unique marker variable (DDPRUN_LEAKTEST=<uuid>) in ddprun's own
environment. Workers, their children and daemonized grandchildren inherit it, so scanning
/proc/*/environ for it finds every process of the job that is still alive, however it detached.
ddprun's stdout/stderr go to files, never to pipes, so a leaked process that holds them can
never hang a test.
"""

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKERS = os.path.join(REPO, "tests", "integration", "workers")

BIN_DIR = os.environ.get("DDPRUN_BIN") or os.path.join(REPO, "build", "bin")
DDPRUN = os.path.join(BIN_DIR, "ddprun")
PYTHON_EXEC = os.environ.get("PYTHON_EXEC") or "/usr/bin/python3"
SH = "/bin/sh"
MARKER_NAME = "DDPRUN_LEAKTEST"
LEAK_GRACE_S = 2.0
# How long a job may take before a test gives up on it: a safety timeout, not a speed claim (speed
# is measured in bench/). A test that checks that ddprun does NOT wait for something (a sleeping
# sibling, a grace period, a poll tick) makes that something last far longer than this.
SAFETY_TIMEOUT_S = 30

# Text that must never appear on ddprun's stderr for an expected failure.
CRASH_TEXTS = ("terminate called", "what():", "std::", "Traceback (most recent call last)",
               "Aborted", "core dumped", "Segmentation fault", "exception")


def worker(name):
    """Path of a worker script under workers/ (run as `/bin/sh PATH`, so no mode bits matter)."""
    return os.path.join(WORKERS, name)


def _read_proc(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _proc_state(pid):
    data = _read_proc("/proc/%d/stat" % pid)
    close = data.rfind(b")")
    if close < 0 or close + 2 >= len(data):
        return None
    return chr(data[close + 2])


def _cmdline(pid):
    return _read_proc("/proc/%d/cmdline" % pid).replace(b"\0", b" ").decode("utf-8", "replace").strip()


def marked_processes(marker):
    """Live (non-zombie) processes other than this one whose environment holds MARKER_NAME=marker."""
    needle = ("%s=%s" % (MARKER_NAME, marker)).encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        env = _read_proc("/proc/%d/environ" % pid)
        if needle not in env.split(b"\0"):
            continue
        state = _proc_state(pid)
        if state is None or state in "ZX":
            continue
        found.append(pid)
    return found


def kill_marked(marker, rounds=50):
    """SIGKILLs every process carrying the marker until none is left (cleanup only)."""
    for _ in range(rounds):
        pids = marked_processes(marker)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def survivors_after(marker, grace=LEAK_GRACE_S):
    """Polls up to `grace` seconds for the job's processes to be gone; returns descriptions of
    those still alive after that (and kills them, so that the machine stays clean)."""
    deadline = time.monotonic() + grace
    while True:
        pids = marked_processes(marker)
        if not pids or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    described = ["pid %d (%s): %s" % (pid, _proc_state(pid), _cmdline(pid)) for pid in pids]
    if pids:
        kill_marked(marker)
    return described


class Result:
    def __init__(self, returncode, stdout, stderr, elapsed, cmd):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.elapsed = elapsed
        self.cmd = cmd

    def describe(self):
        return "command: %s\nexit: %s after %.2fs\n--- stdout (tail) ---\n%s\n--- stderr (tail) ---\n%s" % (
            " ".join(self.cmd), self.returncode, self.elapsed, self.stdout[-3000:], self.stderr[-3000:])


class Job:
    """One ddprun process, started in its own session with the leak marker in its environment."""

    def __init__(self, test, args, env=None, cwd=None, marker=None):
        self.test = test
        self.marker = marker or uuid.uuid4().hex
        self.cmd = [DDPRUN] + list(args)
        # A Slurm job's variables would make ddprun take its flags from the step (README: Slurm);
        # tests that want Slurm set them through `env`.
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        full_env["PYTHON_EXEC"] = PYTHON_EXEC
        # ddprun's own run folders (kept after kill -9) land in the test's temp dir, removed at the end.
        full_env["TMPDIR"] = test.tmp
        for name, value in (env or {}).items():
            if value is None:
                full_env.pop(name, None)  # None: unset for this job
            else:
                full_env[name] = value
        full_env[MARKER_NAME] = self.marker
        self._out_path = os.path.join(test.tmp, "ddprun_stdout_%s" % self.marker)
        self._err_path = os.path.join(test.tmp, "ddprun_stderr_%s" % self.marker)
        out = open(self._out_path, "wb")
        err = open(self._err_path, "wb")
        try:
            self.start = time.monotonic()
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=full_env,
                                         cwd=cwd or test.tmp, start_new_session=True)
        finally:
            out.close()
            err.close()
        self.end = None
        test.addCleanup(self._cleanup)

    @property
    def pid(self):
        return self.proc.pid

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout=SAFETY_TIMEOUT_S, why=""):
        """Waits for ddprun to exit; on timeout (a safety timeout) kills the job and fails the
        test, saying `why` the job should have ended by then."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._cleanup()
            self.test.fail("ddprun did not exit within the %ss safety timeout%s\n%s" % (
                timeout, (": " + why) if why else "", self.result(None).describe()))
        self.end = time.monotonic()
        return self.result(rc)

    def result(self, rc):
        elapsed = (self.end or time.monotonic()) - self.start
        return Result(rc, self._read(self._out_path), self._read(self._err_path), elapsed, self.cmd)

    @staticmethod
    def _read(path):
        try:
            with open(path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def survivors(self, grace=LEAK_GRACE_S):
        return survivors_after(self.marker, grace)

    def _cleanup(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.kill()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        kill_marked(self.marker)


class DdprunTestCase(unittest.TestCase):
    """Base class: a temp dir per test, and every job's processes are gone at the end of the test."""

    def setUp(self):
        self.assertTrue(os.access(DDPRUN, os.X_OK), "ddprun not found at %s (set DDPRUN_BIN)" % DDPRUN)
        self.tmp = tempfile.mkdtemp(prefix="ddprun_integ_")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    # --- starting jobs -------------------------------------------------------------------
    def start(self, args, env=None, cwd=None):
        return Job(self, args, env=env, cwd=cwd)

    def run_job(self, args, env=None, timeout=SAFETY_TIMEOUT_S, check_leaks=True, cwd=None, why=""):
        """Runs ddprun to completion (failing after the safety timeout, saying `why` it should have
        ended); asserts that nothing of the job outlives it by 2 s."""
        job = self.start(args, env=env, cwd=cwd)
        res = job.wait(timeout, why)
        if check_leaks:
            self.assert_no_survivors(job, res)
        return res

    def assert_no_survivors(self, job, res=None, grace=LEAK_GRACE_S):
        left = job.survivors(grace)
        if left:
            self.fail("%d process(es) of the job outlived ddprun by %.1fs:\n  %s%s" % (
                len(left), grace, "\n  ".join(left), ("\n" + res.describe()) if res else ""))

    # --- files ---------------------------------------------------------------------------
    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def write_file(self, name, text, executable=False):
        p = self.path(name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(textwrap.dedent(text).lstrip("\n"))
        if executable:
            os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return p

    def script(self, name, body):
        """An executable #!/bin/sh script in the temp dir."""
        return self.write_file(name, "#!/bin/sh\n" + textwrap.dedent(body).lstrip("\n"), executable=True)

    def read(self, name):
        with open(self.path(name)) as f:
            return f.read()

    def wait_for_files(self, names, timeout=15, job=None):
        """Waits until every file exists (workers write them when ready)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(os.path.exists(self.path(n)) for n in names):
                return
            if job is not None and job.proc.poll() is not None:
                self.fail("ddprun exited (%s) before the workers were ready\n%s" % (
                    job.proc.returncode, job.result(job.proc.returncode).describe()))
            time.sleep(0.02)
        missing = [n for n in names if not os.path.exists(self.path(n))]
        extra = job.result(job.proc.poll()).describe() if job else ""
        self.fail("workers not ready after %ss, missing %s\n%s" % (timeout, missing, extra))

    # --- assertions ----------------------------------------------------------------------
    def assert_exit(self, res, expected):
        self.assertEqual(res.returncode, expected, "wrong exit status\n" + res.describe())

    def assert_no_crash_text(self, text, res=None):
        for bad in CRASH_TEXTS:
            self.assertNotIn(bad, text, "unexpected crash text %r on stderr\n%s" % (bad, res.describe() if res else text))


def hostname():
    return socket.gethostname()


def main():
    """unittest's main with honest skips (tests/unittest_main.py)."""
    import unittest_main
    unittest_main.main()
