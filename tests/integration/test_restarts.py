"""Restarts: --max_restarts restarts the whole worker group with TORCHELASTIC_RESTART_COUNT set to
the attempt number, a spent budget ends the job with the failing exit code, and restarts are
event-driven (no wait for a --monitor_interval tick). Time limits are safety timeouts
(SAFETY_TIMEOUT_S): what ddprun must not wait for lasts far longer."""

from ddprun_testlib import DdprunTestCase, main

# Records every attempt it runs in, then: rank 1 fails while the attempt number is below
# SUCCEED_FROM (once rank 0 has recorded the attempt too), everything else succeeds.
WORKER = """
echo "$TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS $RANK $WORLD_SIZE" >> "%(d)s/attempts_$LOCAL_RANK"
if [ "$LOCAL_RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt %(succeed_from)d ]; then
  until grep -q "^$TORCHELASTIC_RESTART_COUNT " "%(d)s/attempts_0" 2>/dev/null; do sleep 0.01; done
  echo "rank 1 fails in attempt $TORCHELASTIC_RESTART_COUNT" >&2
  exit %(code)d
fi
%(rest)s
"""


class RestartTest(DdprunTestCase):
    def worker(self, succeed_from, code=3, rest="exit 0"):
        return self.script("worker.sh", WORKER % {"d": self.tmp, "succeed_from": succeed_from, "code": code,
                                                  "rest": rest})

    def attempts(self, local_rank):
        return [line.split() for line in self.read("attempts_%d" % local_rank).splitlines()]

    def test_succeeds_on_third_attempt(self):
        prog = self.worker(succeed_from=2)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--max_restarts=2", prog])
        self.assert_exit(res, 0)
        for lr in (0, 1):
            got = self.attempts(lr)
            self.assertEqual([a[0] for a in got], ["0", "1", "2"],
                             "local rank %d saw wrong TORCHELASTIC_RESTART_COUNT\n%s" % (lr, res.describe()))
            self.assertTrue(all(a[1] == "2" for a in got), got)          # TORCHELASTIC_MAX_RESTARTS
            self.assertTrue(all(a[2] == str(lr) for a in got), got)      # same rank every attempt
            self.assertTrue(all(a[3] == "2" for a in got), got)          # WORLD_SIZE

    def test_budget_exhausted_returns_failing_exit_code(self):
        prog = self.worker(succeed_from=99, code=21)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--max-restarts", "2", prog])
        self.assert_exit(res, 21)
        self.assertEqual([a[0] for a in self.attempts(1)], ["0", "1", "2"], res.describe())
        self.assertEqual([a[0] for a in self.attempts(0)], ["0", "1", "2"], res.describe())
        self.assertIn("rank 1 fails in attempt 2", res.stderr, res.describe())
        self.assert_no_crash_text(res.stderr, res)

    def test_no_restart_by_default(self):
        prog = self.worker(succeed_from=1, code=6)
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog])
        self.assert_exit(res, 6)
        self.assertEqual([a[0] for a in self.attempts(1)], ["0"], res.describe())

    def test_restarts_stop_the_surviving_sibling(self):
        # Rank 0 would sleep ten minutes in every attempt; each failure of rank 1 must stop it.
        prog = self.worker(succeed_from=2, rest='if [ "$TORCHELASTIC_RESTART_COUNT" -lt 2 ]; then exec sleep 600; fi\nexit 0')
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--max_restarts=2", prog],
                           why="rank 0 sleeps 600 s in attempts 0 and 1 unless the restart stops it")
        self.assert_exit(res, 0)
        self.assertEqual([a[0] for a in self.attempts(0)], ["0", "1", "2"], res.describe())

    def test_restarts_are_event_driven_even_with_long_monitor_interval(self):
        # torchrun polls every --monitor_interval; with 60 s, four attempts would take >= 180 s.
        prog = self.worker(succeed_from=3)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--max_restarts=3", "--monitor_interval=60", prog],
                           why="restarts that waited for --monitor_interval=60 ticks take >= 180 s")
        self.assert_exit(res, 0)
        self.assertEqual([a[0] for a in self.attempts(1)], ["0", "1", "2", "3"], res.describe())

    def test_python_worker_restarts_from_env(self):
        prog = self.write_file("restart.py", """
            import os, sys, time
            tmp = %r
            count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
            with open(os.path.join(tmp, "py_attempts_" + os.environ["LOCAL_RANK"]), "a") as f:
                f.write("%%d\\n" %% count)
            # Fail only once both ranks recorded this attempt: a fast failure would stop the other
            # rank before its interpreter even started (right for ddprun, but not what this tests).
            deadline = time.time() + 20
            while time.time() < deadline and not all(
                    os.path.exists(os.path.join(tmp, "py_attempts_%%d" %% r)) for r in (0, 1)):
                time.sleep(0.01)
            sys.exit(0 if count >= 1 else 8)
            """ % self.tmp)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--max_restarts=1", prog])
        self.assert_exit(res, 0)
        for lr in (0, 1):
            self.assertEqual(self.read("py_attempts_%d" % lr).split(), ["0", "1"], res.describe())


if __name__ == "__main__":
    main()
