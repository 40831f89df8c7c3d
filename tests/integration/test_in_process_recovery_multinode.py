"""--recovery=in_process across nodes, with real ddprun agents on loopback, real torch (PYTHON_EXEC:
Debian's 1.13, or the torch 2.x tier's) and gloo: examples/torch/recoverable_ddp.py, 2 nodes of 2
ranks.

- a rank of the second node SIGKILLed: its agent replaces it; the first node's agent, told of the
  interruption by the rendezvous, keeps its workers and tells them the next round;
- rank 0 (on the node that hosts the rendezvous) SIGKILLed: the same the other way round;
- a warm spare of the second node taking the killed rank's place;
- a lost node (its agent SIGKILLed, its workers gone with it) with a standby node: the survivor's
  workers stay, the standby's start fresh in the lost node's place and take their state from the
  live ones.

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
        ranks = {}
        for rank, pid, _ in self.starts():
            if rank >= 0:  # a spare logs rank -1 when it starts
                ranks.setdefault(rank, []).append(pid)
        # Every rank started once: rank 2's place was taken by node 1's spare, not a new process.
        self.assertEqual(sorted(ranks), [0, 1, 2, 3], self.starts())
        self.assertTrue(all(len(p) == 1 for p in ranks.values()), self.starts())
        self.assert_no_leftovers(jobs)

    def test_a_lost_node_is_replaced_by_a_standby_node(self):
        want = self.expected_digest()
        port = ml.free_port()
        conf = "heartbeat_timeout=5,last_call_timeout=1"
        args = self.elastic_args("2:2", port, nproc=NPROC, conf=conf,
                                 extra=["--recovery=in_process", "--max_restarts=2", "--log_level=info"]) + \
            self.script_args(step_ms=40)
        a = self.agent("a", args, env=self.env())
        self.assertTrue(ml.wait_listening(port, proc=a.proc), a.result(a.poll()).describe())
        b = self.agent("b", args, env=self.env())
        jobs = [a, b]
        deadline = time.monotonic() + TIMEOUT
        while "step 10\n" not in a.stdout() and time.monotonic() < deadline:  # rank 0 is a's (it joined first)
            self.assertIsNone(a.poll(), self.describe_all(jobs))
            time.sleep(0.1)
        c = self.agent("c", args, env=self.env())  # the round is full: c stands by
        jobs.append(c)
        while a.stderr().count("joined") < 3 and time.monotonic() < deadline:
            self.assertIsNone(c.poll(), self.describe_all(jobs))
            time.sleep(0.1)
        before = {rank: pid for rank, pid, _ in self.starts()}
        b.kill(signal.SIGKILL)  # the agent only, as a crash: its workers die with it (their lifeline)
        res_a, res_c = self.wait_all([a, c], TIMEOUT)
        self.assertEqual(res_a.returncode, 0, self.describe_all(jobs))
        self.assertEqual(res_c.returncode, 0, self.describe_all(jobs))
        self.assertEqual(self.digest(res_a.stdout), want, self.describe_all(jobs))
        starts = self.starts()
        for rank in (0, 1):  # a's ranks: the same processes from start to end
            self.assertEqual([pid for r, pid, _ in starts if r == rank], [before[rank]], starts)
        for rank in (2, 3):  # b's ranks: started again, on c
            self.assertEqual(len([pid for r, pid, _ in starts if r == rank]), 2, starts)
        self.assertIn("live rank(s) here told round", res_a.stderr)
        self.assert_no_leftovers(jobs)


if __name__ == "__main__":
    main()
