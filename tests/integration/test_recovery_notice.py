"""The worker side of in-process recovery (python/ddprun/recovery.py): the agent's "recover ..."
notice as the package parses it (good, malformed, unknown keys, the newest of several, stale
rounds, a forked child that must not read), the opt-in token "recoverable=1" on the beats, and,
with a socket pair standing in for the agent, the whole loop on two real ranks of
examples/torch/recoverable_ddp.py: a rank killed mid-run, the survivor told the new round and a
replacement started, the job ending with the digest of an uninterrupted run and the survivor's pid
kept. The parser and beat tests need neither torch nor the ddprun binary; the loop needs torch
(skipped without it)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import ddprun
from ddprun import _heartbeat
import ddprun.recovery as recovery
import heartbeat_golden
from unittest_main import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import ports  # noqa: E402
EXAMPLE = os.path.join(REPO, "examples", "torch", "recoverable_ddp.py")
PYTHON = os.environ.get("PYTHON_EXEC") or "/usr/bin/python3"

GOOD = (b"recover round=3 restart=2 rank=1 world=4 local_rank=1 master_addr=10.0.0.7 master_port=29611 "
        b"reason=rank 2 (node b, pid 77) exited with signal 9")


class Agent:
    """The agent's end of one worker's channel: DDPRUN_HEARTBEAT_FD names the worker's end."""

    def __init__(self, test, rank="0", round_="1"):
        names = ("DDPRUN_HEARTBEAT_FD", "DDPRUN_HEARTBEAT_SOCKET", "RANK", "DDPRUN_ROUND")
        saved = {k: os.environ.get(k) for k in names}
        test.addCleanup(self._restore, saved)
        self.sock, self.worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        test.addCleanup(self.worker.close)
        test.addCleanup(self.sock.close)
        self.sock.settimeout(5)
        os.environ.pop("DDPRUN_HEARTBEAT_SOCKET", None)
        os.environ["DDPRUN_HEARTBEAT_FD"] = str(self.worker.fileno())
        os.environ["RANK"] = rank
        if round_ is None:
            os.environ.pop("DDPRUN_ROUND", None)
        else:
            os.environ["DDPRUN_ROUND"] = round_
        self._fresh_channel()
        test.addCleanup(self._fresh_channel)

    @staticmethod
    def _fresh_channel():
        if _heartbeat._channel._sock is not None:
            _heartbeat._channel._sock.close()
        _heartbeat._channel = _heartbeat._Channel()
        _heartbeat._channel.min_interval = 0

    def send(self, data):
        self.sock.send(data)

    def next_beat(self):
        return self.sock.recv(512).decode()

    @staticmethod
    def _restore(saved):
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def notice(round_=2, rank=0, world=2, port=29500, reason="rank 1 died", extra=""):
    text = ("recover round=%d restart=%d rank=%d world=%d local_rank=%d master_addr=127.0.0.1 "
            "master_port=%d%s reason=%s" % (round_, round_ - 1, rank, world, rank, port, extra, reason))
    return text.encode()


class ParserTest(unittest.TestCase):
    def test_a_good_notice_gives_every_field_and_the_environment(self):
        n = recovery._parse_notice(GOOD)
        self.assertEqual((n.round, n.restart, n.rank, n.world, n.local_rank, n.master_addr, n.master_port),
                         (3, 2, 1, 4, 1, "10.0.0.7", 29611))
        self.assertEqual(n.reason, "rank 2 (node b, pid 77) exited with signal 9")
        self.assertEqual(n.environment(), {
            "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29611",
            "TORCHELASTIC_RESTART_COUNT": "2", "DDPRUN_ROUND": "3"})

    def test_order_newline_unknown_keys_and_no_reason(self):
        n = recovery._parse_notice(b"recover master_port=1 future=x=y master_addr=h world=1 rank=0 "
                                   b"local_rank=0 restart=0 round=1\n")
        self.assertEqual((n.master_addr, n.master_port, n.world, n.reason), ("h", 1, 1, ""))
        # "reason=" takes the rest, spaces and '=' and keys-like text included.
        n = recovery._parse_notice(GOOD + b" rank=9 x=y\n")
        self.assertEqual(n.rank, 1)
        self.assertTrue(n.reason.endswith("signal 9 rank=9 x=y"))

    def test_another_kind_of_message_is_no_notice(self):
        for data in (b"hello", b"recovered round=1", b"0 12 section=x"):
            with self.subTest(data=data):
                self.assertIsNone(recovery._parse_notice(data))

    def test_malformed_notices_are_rejected(self):
        base = GOOD.decode()
        bad = [
            base.replace("round=3", "round=x"),
            base.replace("rank=1 ", "rank=-1 "),
            base.replace("rank=1 ", "rank=4 "),  # not in the world
            base.replace("world=4", "world=0"),
            base.replace("master_port=29611", "master_port=70000"),
            base.replace("master_port=29611", "master_port="),
            base.replace(" master_addr=10.0.0.7", ""),
            base.replace("local_rank=1", "local_rank"),
            base.replace("restart=2", "restart=2 restart=3"),
            "recover",
        ]
        for text in bad:
            with self.subTest(text=text):
                with self.assertRaises(ValueError):
                    recovery._parse_notice(text.encode())
        with self.assertRaises(ValueError):
            recovery._parse_notice(GOOD + b"x" * 1024)  # over 1024 bytes
        with self.assertRaises(ValueError):
            recovery._parse_notice(GOOD.replace(b"reason=", b"reason=caf\xc3\xa9 "))  # not ASCII


class ReaderTest(unittest.TestCase):
    def reader(self, agent):
        r = recovery._NoticeReader.open()
        self.addCleanup(r.close)
        return r

    def test_no_channel_no_notice(self):
        saved = os.environ.pop("DDPRUN_HEARTBEAT_FD", None)
        self.addCleanup(lambda: saved is not None and os.environ.__setitem__("DDPRUN_HEARTBEAT_FD", saved))
        r = recovery._NoticeReader.open()
        self.assertFalse(r.available())
        self.assertIsNone(r.poll())
        start = time.monotonic()
        self.assertIsNone(r.wait(5))
        self.assertLess(time.monotonic() - start, 1)

    def test_poll_never_blocks_and_takes_the_newest_of_several(self):
        agent = Agent(self)
        r = self.reader(agent)
        start = time.monotonic()
        self.assertIsNone(r.poll())
        self.assertLess(time.monotonic() - start, 0.5)
        agent.send(notice(round_=2, port=1001))
        agent.send(b"recover round=banana")  # malformed: warned about and skipped
        agent.send(notice(round_=3, port=1002))
        agent.send(b"someday another kind")
        got = r.poll()
        self.assertEqual((got.round, got.master_port), (3, 1002))
        self.assertIsNone(r.poll())  # all taken

    def test_a_stale_round_is_ignored(self):
        agent = Agent(self, round_="4")
        r = self.reader(agent)
        agent.send(notice(round_=4))
        agent.send(notice(round_=3))
        self.assertIsNone(r.poll())
        agent.send(notice(round_=5))
        self.assertEqual(r.poll().round, 5)

    def test_wait_returns_when_a_notice_comes_and_gives_up_in_time(self):
        agent = Agent(self)
        r = self.reader(agent)
        start = time.monotonic()
        self.assertIsNone(r.wait(0.3))
        self.assertGreaterEqual(time.monotonic() - start, 0.25)
        pid = os.fork()
        if pid == 0:
            try:
                time.sleep(0.3)
                agent.send(notice(round_=7))
            finally:
                os._exit(0)
        got = r.wait(10)
        os.waitpid(pid, 0)
        self.assertEqual(got.round, 7)
        self.assertLess(time.monotonic() - start, 5)

    def test_the_agent_gone_ends_the_wait(self):
        agent = Agent(self)
        r = self.reader(agent)
        agent.sock.close()
        start = time.monotonic()
        self.assertIsNone(r.wait(10))
        self.assertLess(time.monotonic() - start, 2)
        self.assertFalse(r.available())

    def test_a_forked_child_does_not_read(self):
        agent = Agent(self)
        r = self.reader(agent)
        agent.send(notice(round_=2))
        pid = os.fork()
        if pid == 0:  # as a DataLoader worker calling into the package
            code = 1
            try:
                code = 0 if (not r.available() and r.poll() is None) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertEqual(r.poll().round, 2)  # still there for the parent

    def test_commit_raises_round_over_only_with_a_notice(self):
        agent = Agent(self, rank="1")
        runner = recovery._Runner(self.reader(agent))
        ctx = recovery.Context(runner, rank=1, local_rank=1, world_size=2, step=0, restart_count=0, round=1)
        ctx.commit(1)
        self.assertEqual(agent.next_beat(), "1 1\n")
        agent.send(notice(round_=2, rank=1, reason="x"))
        with self.assertRaises(recovery.RoundOver):
            ctx.commit(2)
        self.assertEqual(runner.committed, 2)
        self.assertEqual(runner.notice.round, 2)


class BeatTest(unittest.TestCase):
    def test_the_extra_tokens_come_last_and_the_default_is_the_golden_bytes(self):
        self.assertEqual(_heartbeat._format(3, 42, None, None, ("recoverable=1",)), "3 42 recoverable=1\n")
        self.assertEqual(_heartbeat._format(2, 3, "eval", 0.03, ("recoverable=1",)),
                         "2 3 section=eval time=0.030000 recoverable=1\n")
        for row in [r for r in heartbeat_golden.rows() if r.written]:
            with self.subTest(row=row.line):
                self.assertEqual(_heartbeat._format(row.rank, row.step, row.input_section_clean(), row.input_seconds()),
                                 row.datagram)

    def test_beats_carry_the_token_while_the_channel_has_it(self):
        agent = Agent(self, rank="2")
        ddprun.report_step(5)
        self.assertEqual(agent.next_beat(), "2 5\n")
        _heartbeat._channel.extra = ("recoverable=1",)
        ddprun.report_step(6, 0.5)
        self.assertEqual(agent.next_beat(), "2 6 time=0.500000 recoverable=1\n")
        with ddprun.section("ckpt"):
            self.assertEqual(agent.next_beat(), "2 6 section=ckpt recoverable=1\n")
        self.assertEqual(agent.next_beat(), "2 6 recoverable=1\n")

    def test_a_forced_beat_is_not_thinned(self):
        agent = Agent(self, rank="0")
        _heartbeat._channel.min_interval = 100
        ddprun.report_step(1)
        self.assertEqual(agent.next_beat(), "0 1\n")
        ddprun.report_step(2)  # held back
        _heartbeat._channel.send(force=True)
        self.assertEqual(agent.next_beat(), "0 2\n")

    def test_importing_recovery_imports_no_torch(self):
        code = ("import sys; import ddprun.recovery, ddprun; "
                "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.strip(), "[]")
        self.assertNotIn("recovery", ddprun.__all__)


def free_port():
    # Rank 0 binds its TCPStore there: a reserved port outside the kernel's ephemeral range
    # (scripts/ports.py; a port-0 pick was taken by a parallel test before rank 0 bound it, in CI).
    return ports.free_port("127.0.0.1")


def have_torch():
    return subprocess.run([PYTHON, "-c", "import torch.distributed"], capture_output=True).returncode == 0


class FakeAgentLoopTest(unittest.TestCase):
    """Two ranks of recoverable_ddp.py with this test as their agent: its socket pairs are their
    channels, it replaces a dead rank and tells the survivor the new round."""

    STEPS = 30

    @classmethod
    def setUpClass(cls):
        if not have_torch():
            raise unittest.SkipTest("no torch in %s" % PYTHON)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="recovery-test-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.pids = os.path.join(self.dir, "pids")
        self.procs = []
        self.addCleanup(self._kill_all)

    def _kill_all(self):
        for p, agent, out in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            agent.close()
            out.close()
        self.procs = []

    def spawn(self, rank, port, round_, env_extra, world=2):
        agent, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVERABLE_", "TORCHELASTIC_", "DDPRUN_"))}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT=str(round_ - 1), DDPRUN_ROUND=str(round_),
                   DDPRUN_HEARTBEAT_FD=str(worker.fileno()), DDPRUN_RECOVERY="in_process", RECOVERABLE_PIDS=self.pids,
                   PYTHONPATH=os.path.join(REPO, "python"), OMP_NUM_THREADS="1")
        env.update(env_extra)
        out = open(os.path.join(self.dir, "out_%d_%d" % (rank, round_)), "w+")
        p = subprocess.Popen([PYTHON, EXAMPLE, "--steps", str(self.STEPS), "--step_ms", "20", "--timeout_s", "20",
                              "--notice_timeout_s", "30"], env=env, stdout=out, stderr=subprocess.STDOUT,
                             pass_fds=(worker.fileno(),), cwd=self.dir)
        worker.close()
        self.procs.append((p, agent, out))
        return p, agent, out

    @staticmethod
    def text(out):
        out.flush()
        out.seek(0)
        return out.read()

    def digest(self, out):
        lines = [l for l in self.text(out).splitlines() if l.startswith("digest ")]
        self.assertEqual(len(lines), 1, self.text(out))
        return lines[0].split()[1]

    def run_clean(self):
        port = free_port()
        ranks = [self.spawn(r, port, 1, {}) for r in range(2)]
        for p, _, out in ranks:
            self.assertEqual(p.wait(120), 0, self.text(out))
        return self.digest(ranks[0][2])

    # A rank killed and replaced, rank 0 included, is tested with the real agent, which holds the
    # store's port for the job (test_in_process_recovery.py); here, with rank 0 hosting a TCPStore on a
    # port picked before it binds, a parallel test could take the port first.

    def test_a_notice_to_live_ranks_ends_the_round_at_a_commit_and_the_newest_wins(self):
        # No failure: each rank sees the notices at a commit (RoundOver), or, when its peer left
        # first, in a collective that fails; both act on the newest of the two.
        clean = self.run_clean()
        port, port2, port3 = free_port(), free_port(), free_port()
        ranks = [self.spawn(r, port, 1, {}) for r in range(2)]
        agent0 = ranks[0][1]
        agent0.settimeout(60)
        while int(agent0.recv(512).split()[1]) < 8:  # rank 0's beats: wait for step 8
            pass
        for r, (_, agent, _) in enumerate(ranks):
            agent.send(notice(round_=2, rank=r, port=port2, reason="first"))
            agent.send(notice(round_=3, rank=r, port=port3, reason="second"))
        for p, _, out in ranks:
            self.assertEqual(p.wait(120), 0, self.text(out))
        self.assertEqual(self.digest(ranks[0][2]), clean)
        for r, (_, _, out) in enumerate(ranks):
            self.assertRegex(self.text(out), r"ddprun.recovery: rank %d: round 3 \(restart 2\): second; resuming" % r)
            self.assertNotIn("round 2", self.text(out))

    def test_without_a_notice_the_failure_goes_through(self):
        port = free_port()
        p, agent, out = self.spawn(0, port, 1, {"RECOVERABLE_RAISE_AT": "0:3"}, world=1)
        start = time.monotonic()
        agent.close()  # the agent gone: no notice can come, no wait
        self.assertEqual(p.wait(120), 1, self.text(out))
        self.assertIn("RECOVERABLE_RAISE_AT", self.text(out))
        self.assertLess(time.monotonic() - start, 25)


if __name__ == "__main__":
    main()
