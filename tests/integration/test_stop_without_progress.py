"""--stop_without_progress=K: K restarts in a row after which no rank beat a step beyond the best of
the attempts before end the job early, with a message, instead of spending the whole restart
budget on a crash loop. Programs that never beat are not judged. Real processes; the workers speak
the heartbeat channel through the Python package (python/ddprun)."""

import os

from ddprun_testlib import PYTHON_EXEC, DdprunTestCase, main

PYTHON = PYTHON_EXEC  # the interpreter with torch: Debian's 1.13, or the torch 2.x tier's (tests/torch2)

# Attempt N beats steps first..last (argv: "first:last" per attempt, the last pair repeating), then
# fails with exit code 3. An empty range: it fails before any beat.
WORKER = r'''
import os, sys, time
import ddprun
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
open(os.path.join(sys.argv[1], "attempt_%d_rank_%s" % (attempt, os.environ["RANK"])), "w").close()
ranges = sys.argv[2:]
first, last = ranges[min(attempt, len(ranges) - 1)].split(":")
for step in range(int(first), int(last) + 1):
    ddprun.report_step(step)
    time.sleep(0.01)
time.sleep(0.1)
sys.exit(3)
'''


class StopWithoutProgressTest(DdprunTestCase):
    def attempts(self):
        return sorted({int(n.split("_")[1]) for n in os.listdir(self.tmp) if n.startswith("attempt_")})

    def run_worker(self, ranges, extra):
        prog = self.write_file("w.py", WORKER)
        return self.run_job(["--standalone", "--nproc_per_node=2", "--max_restarts=10"] + extra +
                            [PYTHON, prog, self.tmp] + ranges)

    def test_a_crash_loop_ends_after_k_restarts_without_progress(self):
        # Attempt 0 reaches step 5; every later attempt fails before any step.
        res = self.run_worker(["0:5", "1:0"], ["--stop_without_progress=2"])
        self.assert_exit(res, 3)
        self.assertEqual(self.attempts(), [0, 1, 2], res.describe())
        self.assertIn("2 restarts in a row made no progress", res.stderr, res.describe())
        self.assertIn("beyond 5", res.stderr, res.describe())

    def test_resuming_below_the_best_step_is_no_progress(self):
        # A job resumed from a checkpoint at step 3 that fails at step 5 again, every time.
        res = self.run_worker(["0:5", "3:5"], ["--stop_without_progress=1"])
        self.assert_exit(res, 3)
        self.assertEqual(self.attempts(), [0, 1], res.describe())

    def test_attempts_that_progress_spend_the_budget(self):
        res = self.run_worker(["0:5", "0:8", "0:11", "0:14"], ["--stop_without_progress=1", "--max_restarts=3"])
        self.assert_exit(res, 3)
        self.assertEqual(self.attempts(), [0, 1, 2, 3], res.describe())
        self.assertNotIn("without progress", res.stderr, res.describe())

    def test_programs_that_never_beat_are_not_judged(self):
        prog = self.script("fail.sh", 'touch "%s/attempt_${TORCHELASTIC_RESTART_COUNT}_rank_$RANK"; exit 3' % self.tmp)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--max_restarts=3", "--stop_without_progress=1",
                            prog])
        self.assert_exit(res, 3)
        self.assertEqual(self.attempts(), [0, 1, 2, 3], res.describe())

    def test_off_by_default(self):
        res = self.run_worker(["0:5", "1:0"], ["--max_restarts=3"])
        self.assert_exit(res, 3)
        self.assertEqual(self.attempts(), [0, 1, 2, 3], res.describe())


if __name__ == "__main__":
    main()
