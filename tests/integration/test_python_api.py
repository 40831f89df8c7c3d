"""The Python worker API (python/ddprun): its namespace is the API alone, typed and documented, and
importing it imports only the standard library; heartbeats on the SDK's channel, sections, no-ops
outside ddprun, never blocking or raising into training; and end to end, a Python rank that stops
beating inside a section is declared hung under --hang_timeout and named with its section."""

import inspect
import json
import os
import socket
import subprocess
import sys
import threading
import time
import typing
import unittest
import uuid

import ddprun
from ddprun import _heartbeat  # the private names the tests reach into
from ddprun_testlib import PYTHON_EXEC, DdprunTestCase, main

PYTHON = PYTHON_EXEC  # the interpreter with torch: Debian's 1.13, or the torch 2.x tier's (tests/torch2)

HUNG_IN_SECTION = r'''
import os, time
import ddprun  # from the checkout's python/ through PYTHONPATH (a user has it installed)

def stuck_in_checkpoint():
    time.sleep(600)  # as a rank whose checkpoint waits on a peer that is gone

for step in range(10):
    ddprun.report_step(step)
    time.sleep(0.02)
if os.environ["RANK"] == "1":
    with ddprun.section("checkpoint"):
        stuck_in_checkpoint()
'''


AUTO_CALIBRATED = r'''
import os, time
import ddprun

def stuck_after_warm_up():
    time.sleep(600)

rank = os.environ["RANK"]
for step in range(60):
    ddprun.report_step(step)
    time.sleep(0.02)
    if step % 10 == 9:
        with ddprun.section("checkpoint"):
            time.sleep(0.5)
    if rank == "1" and step == 45:
        stuck_after_warm_up()
'''

# Rank 1 stalls before step 5's all_reduce; rank 0 enters it and waits (gloo: inside
# torch.distributed). Rank 1 beats step 5 a little later than rank 0, so rank 0 is the first to go
# silent: the rank the heartbeats name, though it is rank 1 that holds the job back.
BEHIND_ON_GLOO = r'''
import os, time
import torch
import torch.distributed as dist
import ddprun

def stuck_before_all_reduce():
    time.sleep(600)

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for step in range(10):
    if rank == 1 and step == 5:
        time.sleep(0.5)
        ddprun.report_step(step)
        stuck_before_all_reduce()
    ddprun.report_step(step)
    dist.all_reduce(t)
    time.sleep(0.02)
'''


API = {"enabled", "heartbeat", "report_step", "section"}


def in_fresh_python(code):
    """`code`'s stdout, run by a new interpreter that finds this ddprun: what importing it does is not
    hidden by what this process imported already."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ddprun.__file__)))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("the child failed: %s" % r.stderr)
    return r.stdout


class PackageSurfaceTest(unittest.TestCase):
    """What a reader, an IDE and a type checker see of `import ddprun` (issue #34 item 5)."""

    def test_the_namespace_is_the_api_alone(self):
        # A fresh interpreter: here, other tests' imports (ddprun.lightning) would add names.
        names = json.loads(in_fresh_python(
            "import json, types, ddprun\n"
            "print(json.dumps({n: isinstance(getattr(ddprun, n), types.ModuleType) for n in dir(ddprun)}))"))
        public = {n for n in names if not (n.startswith("__") and n.endswith("__"))}
        self.assertEqual(public, API)  # no os, re, socket, ... and no _heartbeat
        self.assertEqual([n for n in public if names[n]], [], "modules among ddprun's attributes")

    def test_all_and_star_import_are_the_api(self):
        self.assertEqual(sorted(ddprun.__all__), sorted(API))
        namespace = {}
        exec("from ddprun import *", namespace)
        self.assertEqual(set(namespace) - {"__builtins__"}, API)

    def test_the_package_is_typed(self):
        # PEP 561: without py.typed, type checkers ignore an installed package's annotations.
        self.assertTrue(os.path.isfile(os.path.join(os.path.dirname(ddprun.__file__), "py.typed")))

    def test_every_public_call_is_documented_and_annotated(self):
        for name in sorted(API):
            with self.subTest(name=name):
                fn = getattr(ddprun, name)
                self.assertTrue(callable(fn))
                self.assertTrue(inspect.getdoc(fn), "no docstring")
                sig = inspect.signature(fn)  # section: the generator's, through __wrapped__
                self.assertIsNot(sig.return_annotation, inspect.Signature.empty, "no return type")
                for p in sig.parameters.values():
                    self.assertIsNot(p.annotation, inspect.Parameter.empty, "parameter %s" % p.name)
                typing.get_type_hints(fn)  # the hints resolve at run time too (no dangling names)

    def test_importing_it_imports_the_standard_library_only(self):
        # Every training script imports ddprun: it must not pull torch, numpy or Lightning in.
        if sys.version_info < (3, 10):
            self.skipTest("sys.stdlib_module_names is Python 3.10+")
        new = json.loads(in_fresh_python(
            "import json, sys\n"
            "before = set(sys.modules)\n"
            "import ddprun\n"
            "print(json.dumps(sorted(set(sys.modules) - before)))"))
        self.assertIn("ddprun", new)  # the snapshot saw the import
        for top in ("torch", "numpy", "lightning", "pytorch_lightning"):
            self.assertNotIn(top, new)
        self.assertNotIn("ddprun.lightning", new)
        others = [m for m in new if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "ddprun"]
        self.assertEqual(others, [], "not from the standard library")


class Listener:
    """An abstract unix datagram socket standing in for the agent's."""

    def __init__(self, test):
        test.addCleanup(self.close)
        self.name = "@ddprun-test-%s" % uuid.uuid4().hex[:12]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.settimeout(5)

    def next(self):
        return self.sock.recv(512).decode()

    def close(self):
        self.sock.close()


class PythonApiTest(DdprunTestCase):
    def setUp(self):
        super().setUp()
        self.saved = {k: os.environ.get(k) for k in ("DDPRUN_HEARTBEAT_SOCKET", "RANK")}
        self.addCleanup(self.restore)
        _heartbeat._channel = _heartbeat._Channel()  # a fresh channel per test (it caches the socket)
        _heartbeat._channel.min_interval = 0  # every beat goes: the tests below check each one

    def restore(self):
        if _heartbeat._channel._sock is not None:
            _heartbeat._channel._sock.close()
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _heartbeat._channel = _heartbeat._Channel()

    def test_outside_ddprun_every_call_does_nothing(self):
        os.environ.pop("DDPRUN_HEARTBEAT_SOCKET", None)
        self.assertFalse(ddprun.enabled())
        ddprun.heartbeat()
        ddprun.heartbeat(3)
        ddprun.report_step(4, seconds=0.5)
        with ddprun.section("checkpoint"):
            pass

    def test_beats_carry_the_rank_the_step_and_the_section(self):
        listener = Listener(self)
        os.environ["DDPRUN_HEARTBEAT_SOCKET"] = listener.name
        os.environ["RANK"] = "3"
        self.assertTrue(ddprun.enabled())
        ddprun.heartbeat()
        self.assertEqual(listener.next(), "3 0\n")
        ddprun.report_step(41, seconds=0.25)
        self.assertEqual(listener.next(), "3 41 time=0.250000\n")  # the step's compute time
        ddprun.report_step(41, seconds="bad")  # never raises: the time is dropped, the beat sent
        self.assertEqual(listener.next(), "3 41\n")
        ddprun.report_step(41, seconds=-1)
        self.assertEqual(listener.next(), "3 41\n")
        with ddprun.section("checkpoint"):
            self.assertEqual(listener.next(), "3 41 section=checkpoint\n")
            with ddprun.section("eval at epoch 2/3"):  # sanitized: one token, bounded
                self.assertEqual(listener.next(), "3 41 section=eval_at_epoch_2_3\n")
            self.assertEqual(listener.next(), "3 41 section=checkpoint\n")
            ddprun.heartbeat(42)
            self.assertEqual(listener.next(), "3 42 section=checkpoint\n")
        self.assertEqual(listener.next(), "3 42\n")
        with ddprun.section("x" * 500):
            self.assertEqual(listener.next(), "3 42 section=%s\n" % ("x" * 64))

    def test_beats_closer_than_a_tenth_of_a_second_are_thinned_but_sections_always_go(self):
        listener = Listener(self)
        os.environ["DDPRUN_HEARTBEAT_SOCKET"] = listener.name
        os.environ["RANK"] = "2"
        _heartbeat._channel.min_interval = 0.2
        ddprun.report_step(1, seconds=0.01)
        self.assertEqual(listener.next(), "2 1 time=0.010000\n")
        ddprun.report_step(2, seconds=0.02)  # too soon: not sent
        ddprun.report_step(3, seconds=0.04)
        with ddprun.section("eval"):  # a section change always goes, with the mean step time
            self.assertEqual(listener.next(), "2 3 section=eval time=0.030000\n")
        self.assertEqual(listener.next(), "2 3\n")
        time.sleep(0.25)
        ddprun.report_step(4)
        self.assertEqual(listener.next(), "2 4\n")

    def test_the_last_thinned_beat_goes_at_exit(self):
        # A short attempt's last steps must reach the agent (--stop_without_progress judges them).
        listener = Listener(self)
        env = dict(os.environ, DDPRUN_HEARTBEAT_SOCKET=listener.name, RANK="5")
        code = "import ddprun\nfor s in range(1, 50): ddprun.report_step(s)\nraise SystemExit(3)\n"
        rc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode
        self.assertEqual(rc, 3)
        self.assertEqual(listener.next(), "5 1\n")
        self.assertEqual(listener.next(), "5 49\n")

    def test_it_never_blocks_or_raises(self):
        listener = Listener(self)
        os.environ["DDPRUN_HEARTBEAT_SOCKET"] = listener.name
        os.environ["RANK"] = "0"
        done = threading.Event()

        def flood():
            for step in range(20000):  # far more than the socket queues: the rest is dropped
                ddprun.heartbeat(step)
            done.set()

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        self.assertTrue(done.wait(60), "a heartbeat blocked on a full socket")
        listener.sock.close()  # the agent is gone
        ddprun.heartbeat(1)
        ddprun.heartbeat("not a step")  # ignored, not raised
        os.environ["RANK"] = "not a rank"
        _heartbeat._channel._sock.close()
        _heartbeat._channel = _heartbeat._Channel()
        self.assertFalse(ddprun.enabled())
        ddprun.heartbeat(2)

    def test_a_forked_child_beats_on_a_socket_of_its_own(self):
        listener = Listener(self)
        os.environ["DDPRUN_HEARTBEAT_SOCKET"] = listener.name
        os.environ["RANK"] = "5"
        ddprun.heartbeat(1)
        self.assertEqual(listener.next(), "5 1\n")
        parent_sock = _heartbeat._channel._sock
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ddprun.heartbeat(2)
                code = 0 if _heartbeat._channel._sock is not parent_sock else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertEqual(listener.next(), "5 2\n")

    def test_the_lightning_callback_beats_per_batch_and_marks_validation(self):
        try:
            import ddprun.lightning as dl
        except ImportError as e:
            self.skipTest("PyTorch Lightning is not installed (%s)" % e)
        listener = Listener(self)
        os.environ["DDPRUN_HEARTBEAT_SOCKET"] = listener.name
        os.environ["RANK"] = "0"

        class FakeTrainer:  # the callback reads only global_step
            global_step = 12

        cb = dl.DdprunCallback()
        cb.on_train_batch_end(FakeTrainer(), None, None, None, 0)
        self.assertEqual(listener.next(), "0 12\n")
        cb.on_validation_start(FakeTrainer(), None)
        self.assertEqual(listener.next(), "0 12 section=validation\n")
        cb.on_validation_end(FakeTrainer(), None)
        self.assertEqual(listener.next(), "0 12\n")

    def test_a_rank_hung_in_a_section_is_declared_hung_and_named(self):
        prog = self.write_file("hung.py", HUNG_IN_SECTION)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--hang_timeout=1", PYTHON, prog],
                           why="rank 1 sleeps 600 s in its checkpoint unless --hang_timeout=1 catches it")
        self.assert_exit(res, 124)
        self.assertRegex(res.stderr, r"rank\s*:\s*1\b", res.describe())
        self.assertIn("after step 9, in section 'checkpoint'", res.stderr, res.describe())

    def test_auto_hang_timeout_learns_the_bound_and_catches_a_python_rank(self):
        # Steps of ~20 ms, checkpoints of ~0.5 s every 10 steps: the bounds are learned per section
        # (the 3 s floor for steps; 5 x 0.5 s for the checkpoint, whose slow beats are no hang),
        # logged, and rank 1's stop in a function named for the test is caught at the step bound,
        # far below the 600 s initial one, with its Python stack.
        prog = self.write_file("auto.py", AUTO_CALIBRATED)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--hang_timeout=auto", PYTHON, prog],
                           why="rank 1 sleeps 600 s unless the learned bound catches it")
        self.assert_exit(res, 124)
        out = res.describe()
        self.assertRegex(res.stderr, r"--hang_timeout=auto: section '\(none\)': longest interval [0-9.]+s x 5, "
                                     r"floor 3.00s: a rank silent 3.00s there is hung", out)
        self.assertRegex(res.stderr, r"--hang_timeout=auto: section 'checkpoint': longest interval 0\.[4-9]\d*s", out)
        self.assertRegex(res.stderr, r"rank\s*:\s*1\b", out)
        self.assertIn("(bound 3.0s, learned by --hang_timeout=auto)", res.stderr, out)
        self.assertIn("stuck_after_warm_up", res.stderr, out)  # the stack of the hung rank
        self.assertLess(res.elapsed, 60, out)

    def test_the_stacks_name_the_rank_behind_when_the_first_silent_rank_waits_for_it(self):
        probe = subprocess.run([PYTHON, "-c", "import torch"], capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            self.skipTest("PyTorch is not installed for %s (%s)" % (PYTHON, probe.stderr.strip().splitlines()[-1:]))
        prog = self.write_file("behind.py", BEHIND_ON_GLOO)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--hang_timeout=2", PYTHON, prog],
                           why="rank 1 sleeps 600 s unless --hang_timeout=2 catches the job")
        self.assert_exit(res, 124)
        out = res.describe()
        self.assertIn("worker rank 0 (local_rank 0", res.stderr, out)  # the first to go silent
        self.assertIn("stacks: rank 1 is outside every torch.distributed call while rank 0 waits in one: "
                      "rank 1 is the one behind (rank 0, the first to go silent, waits for it)", res.stderr, out)
        self.assertIn("stuck_before_all_reduce", res.stderr, out)


if __name__ == "__main__":
    main()
