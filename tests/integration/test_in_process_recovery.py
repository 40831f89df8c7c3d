"""--recovery=in_process with a real ddprun, real torch (PYTHON_EXEC: Debian's 1.13, or the torch 2.x
tier's) and gloo: examples/torch/recoverable_ddp.py, 3 ranks on one node.

Every case asserts what the issue asks of it: the survivors' process ids did not change (the
script logs "rank pid restart" per process start), the job's exit status, and the final digest
against the same job without a failure (bit-identical parameters: at most one step lost, every
rank resumed from one consistent state). Cases: a rank SIGKILLed mid-run, rank 0 SIGKILLed (the
store is the agent's, it outlives rank 0), a rank that raises, a rank found hung by its heartbeat,
two failures in a row, the budget spent (the job fails as with restarts), and the flags that
cannot go together (exit 2). Without --recovery=in_process the same failure restarts every rank.
"""

import os
import re
import unittest

import ddprun_testlib as tl
from ddprun_testlib import main

EXAMPLE = os.path.join(tl.REPO, "examples", "torch", "recoverable_ddp.py")
STEPS = 80
NPROC = 3
TIMEOUT = 150  # safety only: every process imports torch on 2 cores


class InProcessRecoveryTest(tl.DdprunTestCase):
    baseline = None  # the digest of the job without a failure, once per class

    def job(self, flags=(), env=None, steps=STEPS, extra_args=()):
        pids = self.path("pids_%d.txt" % len(os.listdir(self.tmp)))
        e = {"PYTHONPATH": os.path.join(tl.REPO, "python"), "RECOVERABLE_PIDS": pids}
        e.update(env or {})
        res = self.run_job(["--nproc_per_node=%d" % NPROC] + list(flags) +
                           [EXAMPLE, "--steps", str(steps), "--timeout_s", "20", "--notice_timeout_s", "30"] +
                           list(extra_args), env=e, timeout=TIMEOUT)
        starts = []
        if os.path.exists(pids):
            with open(pids) as f:
                starts = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
        return res, starts

    @staticmethod
    def digest(res):
        found = re.findall(r"digest ([0-9a-f]{16})", res.stdout)
        return found[-1] if found else None

    def expected_digest(self):
        if InProcessRecoveryTest.baseline is None:
            res, _ = self.job()
            self.assert_exit(res, 0)
            InProcessRecoveryTest.baseline = self.digest(res)
            self.assertIsNotNone(InProcessRecoveryTest.baseline, res.describe())
        return InProcessRecoveryTest.baseline

    def assert_recovered(self, res, starts, replaced, recoveries=1):
        """Exit 0, the baseline's digest, each rank in `replaced` started again (once per time it
        failed), every other rank's process the same from start to end."""
        self.assert_exit(res, 0)
        self.assertEqual(self.digest(res), self.expected_digest(), "parameters differ from the run without a failure\n" +
                         res.describe())
        by_rank = {}
        for rank, pid, restart in starts:
            by_rank.setdefault(rank, []).append((pid, restart))
        for rank in range(NPROC):
            if rank in replaced:
                self.assertEqual(len(by_rank.get(rank, [])), replaced.count(rank) + 1, (rank, starts))
            else:
                self.assertEqual(len(by_rank.get(rank, [])), 1, "survivor rank %d was restarted: %s" % (rank, starts))
        self.assertEqual(res.stderr.count("recovered in process"), recoveries, res.describe())
        self.assertNotIn("restarting workers", res.stderr, res.describe())

    def test_a_rank_killed_mid_run_is_replaced_and_the_others_keep_their_processes(self):
        res, starts = self.job(["--recovery=in_process", "--max_restarts=2"], {"RECOVERABLE_DIE_AT": "1:30"})
        self.assert_recovered(res, starts, [1])
        self.assertIn("resuming at step 30", res.stdout + res.stderr)

    def test_rank_0_killed(self):
        res, starts = self.job(["--recovery=in_process", "--max_restarts=2"], {"RECOVERABLE_DIE_AT": "0:30"})
        self.assert_recovered(res, starts, [0])

    def test_a_rank_that_raises(self):
        res, starts = self.job(["--recovery=in_process", "--max_restarts=2"], {"RECOVERABLE_RAISE_AT": "2:30"})
        self.assert_recovered(res, starts, [2])
        self.assertIn("raised under ddprun.recovery", res.stderr)

    def test_a_rank_found_hung_by_its_heartbeat(self):
        res, starts = self.job(["--recovery=in_process", "--max_restarts=2", "--hang_timeout=10"],
                               {"RECOVERABLE_HANG_AT": "1:30"})
        self.assert_recovered(res, starts, [1])
        self.assertIn("ending hung rank 1", res.stderr)

    def test_two_failures_in_a_row(self):
        # Rank 1 dies in round 1; rank 2 (a survivor) dies in round 2, after the first recovery.
        res, starts = self.job(["--recovery=in_process", "--max_restarts=2"],
                               {"RECOVERABLE_DIE_AT": "1:20,2:50@1"})
        self.assert_recovered(res, starts, [1, 2], recoveries=2)

    def test_a_warm_spare_takes_the_place(self):
        res, starts = self.job(["--recovery=in_process", "--max_restarts=2", "--spares_per_node=1"],
                               {"RECOVERABLE_DIE_AT": "1:30"})
        self.assert_exit(res, 0)
        self.assertEqual(self.digest(res), self.expected_digest(), res.describe())
        self.assertIn("taken over by the spare", res.stderr)
        self.assertIn("spare became rank 1", res.stdout + res.stderr)
        spares = [pid for rank, pid, restart in starts if rank == -1]
        ranks = {}
        for rank, pid, restart in starts:
            if rank >= 0:
                ranks.setdefault(rank, []).append(pid)
        # Every rank started once; rank 1's place was taken by the first spare (logged as rank 1
        # once it became one), not by a new process.
        self.assertEqual(sorted(ranks), [0, 1, 2], starts)
        self.assertEqual([len(ranks[r]) for r in (0, 1, 2)], [1, 2, 1], starts)
        self.assertEqual(ranks[1][1], spares[0], starts)
        self.assertIn("[default1]:ddprun.recovery: spare became rank 1", res.stdout + res.stderr)

    def test_a_script_that_reads_rank_when_it_starts_cannot_have_spares(self):
        script = self.write_file("reads_rank.py", """
            import os, sys
            rank = int(os.environ["RANK"])  # at start: a spare has no RANK
            sys.path.insert(0, %r)
            import ddprun.recovery as recovery
            class S:
                def state_dict(self): return {}
                def load_state_dict(self, d): pass
            recovery.run(lambda ctx: None, S())
        """ % os.path.join(tl.REPO, "python"))
        res = self.run_job(["--nproc_per_node=2", "--recovery=in_process", "--spares_per_node=1", script],
                           env={"PYTHONPATH": os.path.join(tl.REPO, "python")}, timeout=TIMEOUT)
        self.assert_exit(res, 0)  # the ranks ran; the spare's end is no failure of the job
        self.assertIn("cannot have spares", res.stderr, res.describe())

    def test_what_exists_before_run_is_frozen_for_the_collector_while_it_runs(self):
        # Why: a recovery's gc.collect() then scans only what train made (the failed round's DDP),
        # not all of torch's objects (0.2-0.3 s on torch 2.x: bench/RESULTS_RECOVERY.md).
        script = self.write_file("frozen.py", """
            import gc, sys
            sys.path.insert(0, %r)
            import ddprun.recovery as recovery
            class S:
                def state_dict(self): return {}
                def load_state_dict(self, d): pass
            before = gc.get_freeze_count()
            during = recovery.run(lambda ctx: gc.get_freeze_count(), S())
            print("frozen before=%%d during=%%d after=%%d" %% (before, during, gc.get_freeze_count()))
        """ % os.path.join(tl.REPO, "python"))
        res = self.run_job(["--nproc_per_node=1", "--recovery=in_process", script],
                           env={"PYTHONPATH": os.path.join(tl.REPO, "python")}, timeout=TIMEOUT)
        self.assert_exit(res, 0)
        found = re.search(r"frozen before=(\d+) during=(\d+) after=(\d+)", res.stdout)
        self.assertIsNotNone(found, res.describe())
        before, during, after = map(int, found.groups())
        self.assertEqual(before, 0, res.describe())
        self.assertGreater(during, 10000, res.describe())  # torch's objects, at least
        self.assertEqual(after, 0, res.describe())

    def test_the_budget_spent_fails_the_job(self):
        res, starts = self.job(["--recovery=in_process", "--max_restarts=0"], {"RECOVERABLE_DIE_AT": "1:20"})
        self.assertEqual(res.returncode, 128 + 9, res.describe())  # the failed rank's SIGKILL, as with restarts
        self.assertNotIn("recovered in process", res.stderr)

    def test_without_in_process_recovery_every_rank_restarts(self):
        res, starts = self.job(["--max_restarts=2"], {"RECOVERABLE_DIE_AT": "1:30"})
        self.assert_exit(res, 0)
        self.assertIn("restarting workers", res.stderr)
        self.assertEqual(len(starts), 2 * NPROC, starts)  # every rank started twice
        self.assertNotIn("recovered in process", res.stderr)

    def test_flags_that_cannot_go_together_are_exit_2(self):
        for flags, words in ((["--recovery=in_process", "--torch_store=rank0"], "must outlive rank 0"),
                             (["--recovery=sometimes"], "expected restart or in_process"),
                             (["--spares_per_node=2"], "needs --recovery=in_process")):
            res = self.run_job(flags + [EXAMPLE], timeout=30)
            self.assert_exit(res, 2)
            self.assertIn(words, res.stderr)
            self.assert_no_crash_text(res.stderr, res)


if __name__ == "__main__":
    main()
