"""--recovery=in_process across nodes, with real ddprun agents on loopback, real torch (PYTHON_EXEC:
Debian's 1.13, or the torch 2.x tier's) and gloo: examples/torch/recoverable_ddp.py, 2 nodes of 2
ranks.

- a rank of the second node SIGKILLed: its agent replaces it; the first node's agent, told of the
  interruption by the rendezvous, keeps its workers and tells them the next round;
- rank 0 (on the node that hosts the rendezvous) SIGKILLed: the same the other way round;
- a warm spare of the second node taking the killed rank's place;
- a lost node (its agent SIGKILLed, its workers gone with it) with a standby node: the survivor's
  workers stay, the standby's start fresh in the lost node's place and take their state from the
  live ones;
- the same with --spares_per_node: the standby's processes were started while it waited (torch
  imported), and they become the lost node's ranks.

Each case asserts the survivors' process ids did not change (the script logs "rank pid restart"
per process start), the agents' exit status, and the final digest against the same job without a
failure (same world, same rank positions: bit-identical parameters).
"""

import os
import signal
import time

import ddprun_testlib as tl
import multinode_lib as ml
import recovery_lib
from ddprun_testlib import main

EXAMPLE = os.path.join(tl.REPO, "examples", "torch", "recoverable_ddp.py")
STEPS = 60
NPROC = 2
TIMEOUT = 240  # safety only: up to six processes import torch on 2 cores


class MultiNodeInProcessRecoveryTest(ml.MultiNodeTestCase):
    baseline = None

    def env(self, extra=None):
        e = {"PYTHONPATH": os.path.join(tl.REPO, "python"), "RECOVERABLE_PIDS": self.path("pids.txt"),
             "OMP_NUM_THREADS": "1"}
        e.update(extra or {})
        return e

    def script_args(self, steps=STEPS, step_ms=0):
        return [EXAMPLE, "--steps", str(steps), "--step_ms", str(step_ms), "--timeout_s", "20",
                "--notice_timeout_s", "60"]

    def static_job(self, flags=(), env=None):
        port = ml.free_port()
        args = lambda r: (["--nnodes=2", "--node_rank=%d" % r, "--master_addr=127.0.0.1", "--master_port=%d" % port,
                           "--nproc_per_node=%d" % NPROC, "--shutdown_timeout=2"] + list(flags) + self.script_args())
        jobs = [self.agent("n0", args(0), env=self.env(env)), self.agent("n1", args(1), env=self.env(env))]
        return jobs, self.wait_all(jobs, TIMEOUT)

    def starts(self):
        return recovery_lib.read_starts(self.path("pids.txt"))

    digest = staticmethod(recovery_lib.last_digest)

    def expected_digest(self):
        if MultiNodeInProcessRecoveryTest.baseline is None:
            jobs, results = self.static_job(["--max_restarts=0"])
            for r in results:
                self.assertEqual(r.returncode, 0, self.describe_all(jobs))
            MultiNodeInProcessRecoveryTest.baseline = self.digest(results[0].stdout)
            self.assertIsNotNone(MultiNodeInProcessRecoveryTest.baseline, self.describe_all(jobs))
            os.unlink(self.path("pids.txt"))
        return MultiNodeInProcessRecoveryTest.baseline

    def assert_kept(self, starts, replaced, world=NPROC * 2):
        """Each rank in `replaced` started twice, every other rank once (its process kept)."""
        by_rank = {}
        for rank, pid, _ in starts:
            by_rank.setdefault(rank, []).append(pid)
        for rank in range(world):
            want = 2 if rank in replaced else 1
            self.assertEqual(len(by_rank.get(rank, [])), want, "rank %d: %s" % (rank, starts))

    def test_a_rank_of_the_second_node_killed(self):
        want = self.expected_digest()
        jobs, results = self.static_job(["--recovery=in_process", "--max_restarts=2"], {"RECOVERABLE_DIE_AT": "3:25"})
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe_all(jobs))
        self.assertEqual(self.digest(results[0].stdout), want, self.describe_all(jobs))
        self.assert_kept(self.starts(), [3])
        self.assertIn("recovered in process: rank 3", results[1].stderr)
        self.assertIn("live rank(s) here told round", results[0].stderr)  # node 0 carried its ranks
        for r in results:
            self.assertNotIn("restarting workers", r.stderr, self.describe_all(jobs))
        self.assert_no_leftovers(jobs)

    def test_rank_0_killed(self):
        want = self.expected_digest()
        jobs, results = self.static_job(["--recovery=in_process", "--max_restarts=2"], {"RECOVERABLE_DIE_AT": "0:25"})
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe_all(jobs))
        self.assertEqual(self.digest(results[0].stdout), want, self.describe_all(jobs))
        self.assert_kept(self.starts(), [0])
        self.assertIn("live rank(s) here told round", results[1].stderr)
        self.assert_no_leftovers(jobs)

    def test_a_warm_spare_of_the_second_node_takes_the_place(self):
        want = self.expected_digest()
        jobs, results = self.static_job(["--recovery=in_process", "--max_restarts=2", "--spares_per_node=1"],
                                        {"RECOVERABLE_DIE_AT": "2:25"})
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe_all(jobs))
        self.assertEqual(self.digest(results[0].stdout), want, self.describe_all(jobs))
        self.assertIn("taken over by the spare", results[1].stderr)
        self.assertIn("live rank(s) here told round", results[0].stderr)
        ranks, spares = {}, []
        for rank, pid, _ in self.starts():
            if rank >= 0:
                ranks.setdefault(rank, []).append(pid)
            else:  # a spare logs rank -1 when it starts, and its rank once it becomes one
                spares.append(pid)
        # Every rank started once: rank 2's place was taken by one of the spares, not a new process.
        self.assertEqual(sorted(ranks), [0, 1, 2, 3], self.starts())
        self.assertEqual([len(ranks[r]) for r in range(4)], [1, 1, 2, 1], self.starts())
        self.assertIn(ranks[2][1], spares, self.starts())
        self.assert_no_leftovers(jobs)

    def lose_a_node_with_a_standby(self, extra=(), standby_ready=None, step_ms=40):
        """a and b run the job, c stands by; b's agent is SIGKILLed (its workers die with it) once c
        is ready (`standby_ready(c, starts logged before c started)`, else once it joined). Returns (a, c, their results, the
        starts logged before the loss)."""
        port = ml.free_port()
        conf = "heartbeat_timeout=5,last_call_timeout=1"
        args = self.elastic_args("2:2", port, nproc=NPROC, conf=conf,
                                 extra=["--recovery=in_process", "--max_restarts=2", "--log_level=info"] +
                                 list(extra)) + self.script_args(step_ms=step_ms)
        a = self.agent("a", args, env=self.env())
        self.assertTrue(ml.wait_listening(port, proc=a.proc), a.result(a.poll()).describe())
        b = self.agent("b", args, env=self.env())
        jobs = [a, b]
        deadline = time.monotonic() + TIMEOUT
        while "step 2\n" not in a.stdout() and time.monotonic() < deadline:  # rank 0 is a's (it joined first)
            self.assertIsNone(a.poll(), self.describe_all(jobs))
            time.sleep(0.1)
        ready = standby_ready or (lambda c, known: a.stderr().count("joined") >= 3)
        known = self.starts()  # before c started
        c = self.agent("c", args, env=self.env())  # the round is full: c stands by
        jobs.append(c)
        while not ready(c, known) and time.monotonic() < deadline:
            self.assertIsNone(c.poll(), self.describe_all(jobs))
            self.assertIsNone(a.poll(), "the job ended before the standby was ready\n" + self.describe_all(jobs))
            time.sleep(0.1)
        before = self.starts()
        b.kill(signal.SIGKILL)  # the agent only, as a crash: its workers die with it (their lifeline)
        res_a, res_c = self.wait_all([a, c], TIMEOUT)
        self.assertEqual(res_a.returncode, 0, self.describe_all(jobs))
        self.assertEqual(res_c.returncode, 0, self.describe_all(jobs))
        starts = self.starts()
        first = {rank: pid for rank, pid, _ in before if rank >= 0}
        for rank in (0, 1):  # a's ranks: the same processes from start to end
            self.assertEqual([pid for r, pid, _ in starts if r == rank], [first[rank]], starts)
        for rank in (2, 3):  # b's ranks: started again, on c
            self.assertEqual(len([pid for r, pid, _ in starts if r == rank]), 2, starts)
        self.assertIn("live rank(s) here told round", res_a.stderr)
        self.assert_no_leftovers(jobs)
        return res_a, res_c, before, starts

    def test_a_lost_node_is_replaced_by_a_standby_node(self):
        want = self.expected_digest()
        res_a, _, _, _ = self.lose_a_node_with_a_standby()
        self.assertEqual(self.digest(res_a.stdout), want)

    def test_a_standby_node_with_spares_fills_a_lost_node_with_warm_processes(self):
        want = self.expected_digest()

        def standby_ready(c, known):
            # c started its ranks' processes and a spare while it waited, and all three are ready
            # (each logged rank -1 just before ddprun.recovery.run).
            return ("started 3 warm process(es) while waiting for a round" in c.stderr() and
                    len(self.starts()) >= len(known) + 3)

        # Steps of 1 s: the job (60 steps) must outlast the standby's wait (2 s) and three imports of
        # torch, which took over 20 s beside another torch test under ctest -j2 (a CI run where steps
        # of 400 ms ended the job first). The digest does not depend on the step's length.
        res_a, res_c, before, starts = self.lose_a_node_with_a_standby(["--spares_per_node=1"], standby_ready,
                                                                       step_ms=1000)
        self.assertEqual(self.digest(res_a.stdout), want)
        warm = {pid for rank, pid, _ in before if rank == -1}
        for rank in (2, 3):  # the lost ranks' new processes were started before the loss
            self.assertIn([pid for r, pid, _ in starts if r == rank][1], warm, starts)
        self.assertIn("a warm spare starts as rank 2", res_c.stdout + res_c.stderr)

if __name__ == "__main__":
    main()
