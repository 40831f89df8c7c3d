"""No leaks: whatever way the job ends (success, worker failure, SIGTERM/SIGINT to ddprun, kill -9
of ddprun), no process of the job - workers, their children, children that ignore SIGTERM,
grandchildren in a session of their own, double-forked daemons - lives more than 2 s longer.

Every process of the job carries the marker variable that the test put in ddprun's environment
only; workers/descendants.sh leaves descendants of every kind behind."""

import os
import signal
import time

from ddprun_testlib import SH, DdprunTestCase, main, marked_processes, worker

KINDS = ("child", "stubborn", "session", "daemon")


class NoLeaksTest(DdprunTestCase):
    def launcher(self, actions):
        """A worker that runs descendants.sh with a per-rank action, after every rank's
        descendants are running."""
        lines = ['d="%s"' % self.tmp, 'case "$LOCAL_RANK" in']
        for rank, action in enumerate(actions):
            lines.append('  %d) exec %s %s "$d" %s %d ;;' % (rank, SH, worker("descendants.sh"), action, len(actions)))
        lines.append("esac")
        return self.script("launcher.sh", "\n".join(lines) + "\n")

    def descendant_pids(self, nproc):
        pids = []
        for r in range(nproc):
            for kind in KINDS:
                name = "%s_%d" % (kind, r)
                if os.path.exists(self.path(name)):
                    pids.append(int(self.read(name).strip()))
        return pids

    def assert_tracked(self, job, nproc):
        """The marker scan sees every descendant (so that an empty scan later means something)."""
        self.wait_for_files(["ready_%d" % r for r in range(nproc)], job=job)
        live = set(marked_processes(job.marker))
        pids = self.descendant_pids(nproc)
        self.assertEqual(len(pids), nproc * len(KINDS))
        missing = [p for p in pids if p not in live]
        self.assertEqual(missing, [], "descendants not visible to the marker scan")
        self.assertIn(job.pid, live)

    def assert_pids_gone(self, pids):
        alive = []
        for pid in pids:
            stat = ""
            try:
                with open("/proc/%d/stat" % pid) as f:
                    stat = f.read()
            except OSError:
                continue
            if stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X"):
                alive.append(pid)
        self.assertEqual(alive, [], "descendant pids still alive")

    def wait_for_orphans(self, job, count=12, timeout=10):
        """Waits until the forking workers have left orphans behind (the job has > count processes)."""
        deadline = time.monotonic() + timeout
        while len(marked_processes(job.marker)) <= count:
            self.assertLess(time.monotonic(), deadline, "the workers did not fork as expected")
            self.assertIsNone(job.proc.poll(), "ddprun ended early")
            time.sleep(0.05)

    def test_normal_end(self):
        prog = self.launcher(["exit:0", "exit:0"])
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog])
        self.assert_exit(res, 0)
        self.assert_pids_gone(self.descendant_pids(2))
        self.assertEqual(len(self.descendant_pids(2)), 2 * len(KINDS))

    def test_worker_failure(self):
        # Rank 0 fails once rank 1 is ready; rank 1 ignores SIGTERM and must be SIGKILLed.
        prog = self.launcher(["exit:5", "ignore_term"])
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--shutdown_timeout=1", prog])
        self.assert_exit(res, 5)
        self.assertEqual(len(self.descendant_pids(2)), 2 * len(KINDS))
        self.assert_pids_gone(self.descendant_pids(2))

    def _stop_by_signal(self, sig, actions):
        nproc = len(actions)
        prog = self.launcher(actions)
        job = self.start(["--standalone", "--nproc_per_node=%d" % nproc, "--shutdown_timeout=1", prog])
        self.assert_tracked(job, nproc)
        job.signal(sig)
        res = job.wait(30)
        if sig != signal.SIGKILL:
            self.assert_exit(res, 128 + sig)
        self.assert_no_survivors(job, res)
        self.assert_pids_gone(self.descendant_pids(nproc))

    def test_sigterm_to_ddprun(self):
        self._stop_by_signal(signal.SIGTERM, ["wait", "ignore_term"])

    def test_sigint_to_ddprun(self):
        self._stop_by_signal(signal.SIGINT, ["wait", "wait"])

    def test_kill_9_of_ddprun(self):
        # ddprun cannot clean up after itself: its watchdog must, within 2 s, with workers that
        # ignore SIGTERM and daemons that left the process group.
        self._stop_by_signal(signal.SIGKILL, ["ignore_term", "wait"])

    def test_kill_9_of_ddprun_while_worker_keeps_forking(self):
        # A worker that forks a new double-forked orphan every few milliseconds while ddprun dies.
        prog = self.script("forker.sh", """
            echo $$ > "%s/ready_$LOCAL_RANK"
            i=0
            while [ $i -lt 3000 ]; do
              (sleep 20 </dev/null >/dev/null 2>&1 &)
              sleep 0.01
              i=$((i+1))
            done
            """ % self.tmp)
        job = self.start(["--standalone", "--nproc_per_node=2", prog])
        self.wait_for_files(["ready_0", "ready_1"], job=job)
        self.wait_for_orphans(job)
        job.signal(signal.SIGKILL)
        res = job.wait(10)
        self.assertEqual(res.returncode, -signal.SIGKILL)
        self.assert_no_survivors(job, res)

    def test_kill_9_of_ddprun_during_restarts(self):
        # Every attempt leaves a daemon behind and fails; ddprun dies in the middle of restarting.
        prog = self.script("flaky.sh", """
            echo x >> "%s/attempt_$TORCHELASTIC_RESTART_COUNT"
            (trap '' TERM; setsid sleep 300 </dev/null >/dev/null 2>&1 &)
            sleep 0.1
            exit 1
            """ % self.tmp)
        job = self.start(["--standalone", "--nproc_per_node=2", "--max_restarts=100000", prog])
        self.wait_for_files(["attempt_3"], job=job)
        job.signal(signal.SIGKILL)
        res = job.wait(10)
        self.assert_no_survivors(job, res)

    def test_sigterm_during_restarts(self):
        prog = self.script("flaky2.sh", """
            echo x >> "%s/attempt_$TORCHELASTIC_RESTART_COUNT"
            (trap '' TERM; setsid sleep 300 </dev/null >/dev/null 2>&1 &)
            sleep 0.1
            exit 1
            """ % self.tmp)
        job = self.start(["--standalone", "--nproc_per_node=2", "--max_restarts=100000", prog])
        self.wait_for_files(["attempt_3"], job=job)
        job.signal(signal.SIGTERM)
        res = job.wait(20)
        self.assert_exit(res, 128 + signal.SIGTERM)
        self.assert_no_survivors(job, res)

    def test_sigterm_while_worker_keeps_forking(self):
        prog = self.script("forker2.sh", """
            trap '' TERM
            echo $$ > "%s/ready_$LOCAL_RANK"
            i=0
            while [ $i -lt 3000 ]; do
              (trap '' TERM; setsid sleep 20 </dev/null >/dev/null 2>&1 &)
              sleep 0.01
              i=$((i+1))
            done
            """ % self.tmp)
        job = self.start(["--standalone", "--nproc_per_node=2", "--shutdown_timeout=0.5", prog])
        self.wait_for_files(["ready_0", "ready_1"], job=job)
        self.wait_for_orphans(job)
        job.signal(signal.SIGTERM)
        res = job.wait(20)
        self.assert_exit(res, 128 + signal.SIGTERM)
        self.assert_no_survivors(job, res)


if __name__ == "__main__":
    main()
