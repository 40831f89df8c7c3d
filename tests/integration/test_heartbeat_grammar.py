"""The heartbeat grammar (docs/heartbeat.md) as the Python package writes it: every row of the
golden table (tests/data/heartbeat_golden.tsv) that a writer produces comes out of python/ddprun
byte for byte, and the Lightning callback beats with its step time, opens the sections its
docstring names, and is documented and typed. Needs neither the ddprun binary nor Lightning (a
stand-in Callback base is installed for the callback's import)."""

import contextlib
import importlib
import inspect
import os
import re
import signal
import socket
import sys
import time
import types
import unittest

import ddprun
from ddprun import _heartbeat  # the private names the tests reach into
import heartbeat_golden
from unittest_main import main


class Channel:
    """A socket pair standing in for the agent's end of one worker's channel
    (DDPRUN_HEARTBEAT_FD) and, with `address`, a bound socket for the old variable."""

    def __init__(self, test, rank="0", address=False):
        saved = {k: os.environ.get(k) for k in ("DDPRUN_HEARTBEAT_FD", "DDPRUN_HEARTBEAT_SOCKET", "RANK")}
        test.addCleanup(self._restore, saved)
        self._close_channel()
        if address:
            name = "@ddprun-test-%d-%d" % (os.getpid(), id(self))
            self.agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.agent.bind("\0" + name[1:])
            os.environ.pop("DDPRUN_HEARTBEAT_FD", None)
            os.environ["DDPRUN_HEARTBEAT_SOCKET"] = name
        else:
            self.agent, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            test.addCleanup(worker.close)
            os.environ.pop("DDPRUN_HEARTBEAT_SOCKET", None)
            os.environ["DDPRUN_HEARTBEAT_FD"] = str(worker.fileno())
        self.agent.settimeout(5)
        test.addCleanup(self.agent.close)
        os.environ["RANK"] = rank
        _heartbeat._channel = _heartbeat._Channel()
        _heartbeat._channel.min_interval = 0
        test.addCleanup(self._close_channel)

    def next(self):
        return self.agent.recv(512).decode()

    @staticmethod
    def _close_channel():
        if _heartbeat._channel._sock is not None:
            _heartbeat._channel._sock.close()
        _heartbeat._channel = _heartbeat._Channel()

    @staticmethod
    def _restore(saved):
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class GoldenTableTest(unittest.TestCase):
    def test_the_writer_produces_every_written_row(self):
        rows = [r for r in heartbeat_golden.rows() if r.written]
        self.assertGreater(len(rows), 5)
        for row in rows:
            with self.subTest(row=row.line):
                self.assertEqual(_heartbeat._format(row.rank, row.step, row.input_section_clean(), row.input_seconds()),
                                 row.datagram)

    def test_the_api_sends_every_written_row_on_the_channel(self):
        for row in [r for r in heartbeat_golden.rows() if r.written]:
            with self.subTest(row=row.line):
                channel = Channel(self, str(row.rank))
                if row.input_section is not None:  # as inside `with ddprun.section(...)`
                    _heartbeat._channel.sections.append(_heartbeat._clean_section(row.input_section))
                ddprun.report_step(row.step, row.input_seconds_raw())
                self.assertEqual(channel.next(), row.datagram)

    def test_bounds_agree_with_the_table(self):
        self.assertEqual(_heartbeat._MAX_SECTION, heartbeat_golden.MAX_SECTION)
        self.assertEqual(_heartbeat._MAX_STEP_SECONDS, heartbeat_golden.MAX_STEP_SECONDS)


class TransportTest(unittest.TestCase):
    def test_the_inherited_channel_wins_and_the_address_is_the_fallback(self):
        by_address = Channel(self, "4", address=True)
        r, w = os.pipe()  # a descriptor number that is no channel: a child started with close_fds
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)
        os.environ["DDPRUN_HEARTBEAT_FD"] = str(w)
        ddprun.report_step(5)
        self.assertEqual(by_address.next(), "4 5\n")
        os.environ["DDPRUN_HEARTBEAT_FD"] = "not a number"
        Channel._close_channel()
        _heartbeat._channel.min_interval = 0
        ddprun.report_step(6)
        self.assertEqual(by_address.next(), "4 6\n")
        pair = Channel(self, "4")
        os.environ["DDPRUN_HEARTBEAT_SOCKET"] = "@ddprun-test-unused"
        ddprun.report_step(7)
        self.assertEqual(pair.next(), "4 7\n")

    def test_the_agent_gone_is_no_error_of_the_training(self):
        channel = Channel(self, "1")
        ddprun.report_step(1)
        self.assertEqual(channel.next(), "1 1\n")
        previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as a script may have it
        self.addCleanup(signal.signal, signal.SIGPIPE, previous)
        channel.agent.close()
        ddprun.report_step(2)  # EPIPE: dropped, never raised
        ddprun.report_step(3)

    def test_a_forked_child_beats_on_the_channel_with_a_descriptor_of_its_own(self):
        channel = Channel(self, "5")
        ddprun.heartbeat(1)
        self.assertEqual(channel.next(), "5 1\n")
        parent = _heartbeat._channel._sock
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ddprun.heartbeat(2)
                code = 0 if _heartbeat._channel._sock is not parent else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertEqual(channel.next(), "5 2\n")
        ddprun.heartbeat(3)  # the child closed its own descriptor, not the parent's
        self.assertEqual(channel.next(), "5 3\n")


@contextlib.contextmanager
def fake_lightning():
    """Installs `lightning.pytorch.callbacks.Callback` (hooks that do nothing, as Lightning's) and
    imports ddprun.lightning afresh against it."""
    names = ["lightning", "lightning.pytorch", "lightning.pytorch.callbacks"]
    saved = {n: sys.modules.get(n) for n in names + ["ddprun.lightning"]}
    callbacks = types.ModuleType("lightning.pytorch.callbacks")
    hooks = ("on_train_batch_start", "on_before_backward", "on_train_batch_end", "on_validation_start",
             "on_validation_end", "on_save_checkpoint", "on_train_epoch_end", "on_train_end", "on_exception")
    callbacks.Callback = type("Callback", (), {h: lambda self, *a, **k: None for h in hooks})
    sys.modules["lightning"] = types.ModuleType("lightning")
    sys.modules["lightning.pytorch"] = types.ModuleType("lightning.pytorch")
    sys.modules["lightning.pytorch.callbacks"] = callbacks
    sys.modules.pop("ddprun.lightning", None)
    try:
        yield importlib.import_module("ddprun.lightning")
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


class FakeTrainer:  # the callback reads only global_step
    def __init__(self, step):
        self.global_step = step


class LightningCallbackTest(unittest.TestCase):
    def test_a_batch_beats_with_its_step_time(self):
        # Without a step time, stragglers are never found under Lightning.
        channel = Channel(self, "0", address=True)
        with fake_lightning() as dl:
            cb = dl.DdprunCallback()
            cb.on_train_batch_start(FakeTrainer(11), None, None, 0)
            time.sleep(0.02)  # the rank's own work: data, forward
            cb.on_before_backward(FakeTrainer(11), None, None)
            cb.on_train_batch_end(FakeTrainer(12), None, None, None, 0)
            m = re.fullmatch(r"0 12 time=(\d+\.\d{6})\n", channel.next())
            self.assertIsNotNone(m)
            self.assertGreaterEqual(float(m.group(1)), 0.015)
            self.assertLess(float(m.group(1)), 5)

    def test_the_callback_is_documented_and_annotated(self):
        # A library people read: the class and each hook it defines say what they do, typed.
        with fake_lightning() as dl:
            cls = dl.DdprunCallback
            self.assertTrue(inspect.getdoc(cls))
            hooks = [n for n, v in vars(cls).items() if callable(v) and (not n.startswith("_") or n == "__init__")]
            self.assertIn("on_train_batch_end", hooks)
            for name in hooks:
                with self.subTest(hook=name):
                    fn = getattr(cls, name)
                    if name != "__init__":
                        self.assertTrue(fn.__doc__, "no docstring")
                    sig = inspect.signature(fn)
                    self.assertIsNot(sig.return_annotation, inspect.Signature.empty, "no return type")
                    for p in list(sig.parameters.values())[1:]:  # all but self
                        self.assertIsNot(p.annotation, inspect.Parameter.empty, "parameter %s" % p.name)

    def test_validation_and_checkpoint_saving_are_sections(self):
        channel = Channel(self, "0", address=True)
        with fake_lightning() as dl:
            cb = dl.DdprunCallback()
            cb.on_validation_start(FakeTrainer(12), None)
            self.assertEqual(channel.next(), "0 0 section=validation\n")
            cb.on_validation_end(FakeTrainer(12), None)
            self.assertEqual(channel.next(), "0 0\n")
            # Lightning calls on_save_checkpoint before it writes the file and has no hook after:
            # the section lasts until the loop's next hook.
            cb.on_save_checkpoint(FakeTrainer(12), None, {})
            self.assertEqual(channel.next(), "0 0 section=checkpoint\n")
            cb.on_train_batch_start(FakeTrainer(12), None, None, 0)
            self.assertEqual(channel.next(), "0 0\n")
            cb.on_save_checkpoint(FakeTrainer(12), None, {})
            self.assertEqual(channel.next(), "0 0 section=checkpoint\n")
            cb.on_train_end(FakeTrainer(12), None)
            self.assertEqual(channel.next(), "0 0\n")


if __name__ == "__main__":
    main()
