"""--recovery=in_process for C++ trainers (libddp's ddp::runRecoverable, worker_sdk/recovery.h) under
the real ddprun: test-bin/recoverable_trainer, gloo, an integer model whose update depends on every
step's order.

Cases: a rank SIGKILLed mid-run, rank 0 SIGKILLed, a rank hung in its own code (found by
--hang_timeout), two failures in a row, a warm spare taking the place, and a rank of the second of
two nodes. Each asserts the survivors' process ids did not
change (the trainer logs "rank pid restart" per process that becomes a rank), the exit status, and
the final digest against the same job without a failure.
"""

import os

import ddprun_testlib as tl
import multinode_lib as ml
import recovery_lib
from ddprun_testlib import main

TEST_BIN = os.environ.get("DDPRUN_TEST_BIN") or os.path.join(tl.REPO, "build", "test-bin")
TRAINER = os.path.join(TEST_BIN, "recoverable_trainer")
STEPS = 80
NPROC = 3
TIMEOUT = 120  # safety only


class CppInProcessRecoveryTest(ml.MultiNodeTestCase):
    baseline = None

    def setUp(self):
        super().setUp()
        if not os.access(TRAINER, os.X_OK):
            self.skipTest("%s is not built" % TRAINER)

    def job(self, flags=(), env=None, nproc=NPROC, pids="pids.txt"):
        e = {"RECOVERABLE_PIDS": self.path(pids)}
        e.update(env or {})
        return self.run_job(["--nproc_per_node=%d" % nproc] + list(flags) + [TRAINER, str(STEPS), "10"], env=e,
                            timeout=TIMEOUT)

    def starts(self):
        return recovery_lib.read_starts(self.path("pids.txt"))

    digest = staticmethod(recovery_lib.last_digest)

    def expected_digest(self):
        if CppInProcessRecoveryTest.baseline is None:
            res = self.job(["--max_restarts=0"], pids="baseline_pids.txt")  # not the case's own
            self.assert_exit(res, 0)
            CppInProcessRecoveryTest.baseline = self.digest(res.stdout)
            self.assertIsNotNone(CppInProcessRecoveryTest.baseline, res.describe())
        return CppInProcessRecoveryTest.baseline

    def assert_recovered(self, res, replaced, recoveries=1, world=NPROC):
        self.assert_exit(res, 0)
        self.assertEqual(self.digest(res.stdout), self.expected_digest(), res.describe())
        by_rank = {}
        for rank, pid, _ in self.starts():
            by_rank.setdefault(rank, []).append(pid)
        for rank in range(world):
            want = replaced.count(rank) + 1
            self.assertEqual(len(by_rank.get(rank, [])), want, "rank %d: %s\n%s" % (rank, self.starts(),
                                                                                    res.describe()))
        self.assertEqual(res.stderr.count("recovered in process"), recoveries, res.describe())
        self.assertNotIn("restarting workers", res.stderr, res.describe())

    def test_a_rank_killed_mid_run(self):
        want = self.expected_digest()
        res = self.job(["--recovery=in_process", "--max_restarts=2"], {"RECOVERABLE_DIE_AT": "1:30"})
        self.assert_recovered(res, [1])
        self.assertEqual(self.digest(res.stdout), want)

    def test_rank_0_killed(self):
        res = self.job(["--recovery=in_process", "--max_restarts=2"], {"RECOVERABLE_DIE_AT": "0:30"})
        self.assert_recovered(res, [0])

    def test_two_failures_in_a_row(self):
        res = self.job(["--recovery=in_process", "--max_restarts=2"], {"RECOVERABLE_DIE_AT": "1:20,2:50@1"})
        self.assert_recovered(res, [1, 2], recoveries=2)

    def test_a_rank_hung_in_its_own_code_is_found_and_replaced(self):
        # Its peers wait for it in a collective and beat (libddp's monitor, while they wait); the
        # hung rank is silent, found by --hang_timeout, ended, and replaced in place.
        res = self.job(["--recovery=in_process", "--max_restarts=2", "--hang_timeout=3"],
                       {"RECOVERABLE_HANG_AT": "1:30"})
        self.assert_recovered(res, [1])
        self.assertIn("ending hung rank 1", res.stderr)
        self.assertNotIn("ending hung rank 0", res.stderr)
        self.assertNotIn("ending hung rank 2", res.stderr)

    def test_a_warm_spare_takes_the_place(self):
        res = self.job(["--recovery=in_process", "--max_restarts=2", "--spares_per_node=1"],
                       {"RECOVERABLE_DIE_AT": "2:30"})
        self.assert_exit(res, 0)
        self.assertEqual(self.digest(res.stdout), self.expected_digest(), res.describe())
        self.assertIn("taken over by the spare", res.stderr)
        by_rank = {}
        for rank, pid, _ in self.starts():
            by_rank.setdefault(rank, []).append(pid)
        # Every rank became one once: rank 2's place was taken by the spare (a process that logs
        # its start only once it is a rank), not by a new process started then.
        self.assertEqual(sorted(by_rank), [0, 1, 2], self.starts())
        self.assertEqual([len(p) for _, p in sorted(by_rank.items())], [1, 1, 2], self.starts())

    def test_without_in_process_recovery_every_rank_restarts(self):
        res = self.job(["--max_restarts=1"], {"RECOVERABLE_DIE_AT": "1:30"})
        self.assert_exit(res, 0)
        self.assertEqual(self.digest(res.stdout), self.expected_digest(), res.describe())
        self.assertEqual(len(self.starts()), 2 * NPROC, self.starts())  # every rank started twice (from step 0)

    def two_nodes(self, flags, env):
        port = ml.free_port()
        args = lambda r: ["--nnodes=2", "--node_rank=%d" % r, "--master_addr=127.0.0.1", "--master_port=%d" % port,
                          "--nproc_per_node=2", "--shutdown_timeout=2"] + flags + [TRAINER, str(STEPS), "10"]
        jobs = [self.agent("n0", args(0), env=env), self.agent("n1", args(1), env=env)]
        results = self.wait_all(jobs, TIMEOUT)
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe_all(jobs))
        self.assert_no_leftovers(jobs)
        return jobs, results

    def test_a_rank_of_the_second_node_killed(self):
        _, clean = self.two_nodes(["--max_restarts=0"], {})
        want = self.digest(clean[0].stdout)
        self.assertIsNotNone(want, clean[0].stdout)
        jobs, results = self.two_nodes(["--recovery=in_process", "--max_restarts=2"],
                                       {"RECOVERABLE_PIDS": self.path("pids.txt"), "RECOVERABLE_DIE_AT": "3:30"})
        self.assertEqual(self.digest(results[0].stdout), want, self.describe_all(jobs))
        by_rank = {}
        for rank, pid, _ in self.starts():
            by_rank.setdefault(rank, []).append(pid)
        self.assertEqual([len(by_rank.get(r, [])) for r in range(4)], [1, 1, 1, 2],
                         "%s\n%s" % (self.starts(), self.describe_all(jobs)))
        self.assertIn("recovered in process: rank 3", results[1].stderr)
        self.assertIn("live rank(s) here told round", results[0].stderr)


if __name__ == "__main__":
    main()
