"""Signals sent to ddprun: forwarded to every worker, exit status 128+signal, SIGKILL after
--shutdown_timeout for a worker that ignores SIGTERM, and a second SIGINT escalates at once.

Time limits are safety timeouts (SAFETY_TIMEOUT_S): where a test checks that ddprun does not wait
out a grace period, the grace is far longer than that. Lower bounds (ddprun did wait the grace)
are exact properties: a loaded machine only makes things slower."""

import os
import signal
import time

from ddprun_testlib import SH, DdprunTestCase, main, worker

NPROC = 3
# The default --shutdown_timeout (torchrun's): a worker ignoring SIGTERM is killed after it.
DEFAULT_GRACE_S = 30


class SignalForwardingTest(DdprunTestCase):
    def test_forwarded_signals_reach_every_worker(self):
        for sig, name in ((signal.SIGINT, "INT"), (signal.SIGTERM, "TERM"), (signal.SIGHUP, "HUP"),
                          (signal.SIGQUIT, "QUIT")):
            with self.subTest(signal=name):
                sub = self.path(name)
                os.mkdir(sub)
                job = self.start(["--standalone", "--nproc_per_node=%d" % NPROC, "--shutdown_timeout=300",
                                  SH, worker("trap_signals.sh"), sub])
                self.wait_for_files(["%s/ready_%d" % (name, r) for r in range(NPROC)], job=job)
                job.signal(sig)
                # The workers exit at once on the signal: ddprun must not wait out the 300 s grace.
                res = job.wait(why="the workers exit on the signal; ddprun must not wait out the 300 s grace")
                self.assert_exit(res, 128 + sig)
                for r in range(NPROC):
                    self.assertEqual(self.read("%s/sig_%d" % (name, r)).strip(), name,
                                     "worker %d did not get SIG%s\n%s" % (r, name, res.describe()))
                self.assert_no_crash_text(res.stderr, res)
                self.assert_no_survivors(job, res)

    def test_usr1_and_usr2_are_forwarded_by_default(self):
        # Slurm's --signal=USR1@TIME (and checkpoint-on-signal setups) send USR1 or USR2 before the
        # end of a job: by default ddprun forwards them and exits 128+N after the workers, instead
        # of dying at once by the signal's default action as torchrun does.
        for sig, name in ((signal.SIGUSR1, "USR1"), (signal.SIGUSR2, "USR2")):
            with self.subTest(signal=name):
                sub = self.path(name)
                os.mkdir(sub)
                job = self.start(["--standalone", "--nproc_per_node=2", "--shutdown_timeout=300",
                                  SH, worker("trap_signals.sh"), sub])
                self.wait_for_files(["%s/ready_%d" % (name, r) for r in range(2)], job=job)
                job.signal(sig)
                res = job.wait(why="the workers exit on the signal; ddprun must not wait out the 300 s grace")
                self.assert_exit(res, 128 + sig)
                for r in range(2):
                    self.assertEqual(self.read("%s/sig_%d" % (name, r)).strip(), name,
                                     "worker %d did not get SIG%s\n%s" % (r, name, res.describe()))
                self.assertIn("received SIG" + name, res.stderr, res.describe())
                self.assert_no_survivors(job, res)

    def test_worker_ignoring_sigterm_is_killed_after_shutdown_timeout(self):
        prog = self.script("stubborn.sh", """
            trap '' TERM
            echo $$ > "%s/ready_$LOCAL_RANK"
            while :; do sleep 1; done
            """ % self.tmp)
        job = self.start(["--standalone", "--nproc_per_node=2", "--shutdown_timeout=1", prog])
        self.wait_for_files(["ready_0", "ready_1"], job=job)
        time.sleep(0.1)  # both shells are in their loop
        sent = time.monotonic()
        job.signal(signal.SIGTERM)
        res = job.wait(40)
        took = time.monotonic() - sent
        self.assert_exit(res, 128 + signal.SIGTERM)
        self.assertGreaterEqual(took, 0.8, "workers ignoring SIGTERM were not given the 1 s grace\n" + res.describe())
        self.assertLess(took, DEFAULT_GRACE_S - 5, "--shutdown_timeout=1 was not honoured (a generous bound, below "
                        "the default grace of %d s)\n%s" % (DEFAULT_GRACE_S, res.describe()))
        self.assert_no_survivors(job, res)

    def test_shutdown_timeout_dashed_spelling(self):
        prog = self.script("stubborn2.sh", """
            trap '' TERM
            echo $$ > "%s/ready_$LOCAL_RANK"
            while :; do sleep 1; done
            """ % self.tmp)
        job = self.start(["--standalone", "--shutdown-timeout", "1", prog])
        self.wait_for_files(["ready_0"], job=job)
        sent = time.monotonic()
        job.signal(signal.SIGTERM)
        res = job.wait(40)
        took = time.monotonic() - sent
        self.assert_exit(res, 128 + signal.SIGTERM)
        self.assertGreaterEqual(took, 0.8, res.describe())
        self.assertLess(took, DEFAULT_GRACE_S - 5, "--shutdown-timeout 1 was not honoured (a generous bound, below "
                        "the default grace of %d s)\n%s" % (DEFAULT_GRACE_S, res.describe()))

    def test_second_sigint_escalates_to_sigkill(self):
        prog = self.script("deaf.sh", """
            trap '' INT TERM
            echo $$ > "%s/ready_$LOCAL_RANK"
            while :; do sleep 1; done
            """ % self.tmp)
        job = self.start(["--standalone", "--nproc_per_node=2", "--shutdown_timeout=300", prog])
        self.wait_for_files(["ready_0", "ready_1"], job=job)
        time.sleep(0.1)
        job.signal(signal.SIGINT)
        time.sleep(0.3)
        self.assertIsNone(job.proc.poll(), "ddprun exited on the first SIGINT although workers ignore it")
        job.signal(signal.SIGINT)
        res = job.wait(why="the second SIGINT must kill the workers that ignore SIGINT, not wait the 300 s grace")
        self.assert_exit(res, 128 + signal.SIGINT)
        self.assert_no_crash_text(res.stderr, res)
        self.assert_no_survivors(job, res)

    def test_sigints_more_than_a_second_apart_do_not_escalate(self):
        prog = self.script("deaf2.sh", """
            trap '' INT TERM
            echo $$ > "%s/ready_$LOCAL_RANK"
            while :; do sleep 1; done
            """ % self.tmp)
        job = self.start(["--standalone", "--shutdown_timeout=3.5", prog])
        self.wait_for_files(["ready_0"], job=job)
        time.sleep(0.1)
        sent = time.monotonic()
        job.signal(signal.SIGINT)
        time.sleep(1.5)
        job.signal(signal.SIGINT)
        time.sleep(0.5)
        self.assertIsNone(job.proc.poll(), "two SIGINTs 1.5 s apart killed the workers before the grace ended")
        res = job.wait()
        took = time.monotonic() - sent
        self.assert_exit(res, 128 + signal.SIGINT)
        self.assertGreaterEqual(took, 3.2, "the workers were killed before the 3.5 s grace ended\n" + res.describe())

    def test_single_sigint_waits_for_grace(self):
        # Counterpart of the escalation test: one SIGINT alone leaves the ignoring workers running
        # for the grace period, then ddprun kills them.
        prog = self.script("deaf1.sh", """
            trap '' INT TERM
            echo $$ > "%s/ready_$LOCAL_RANK"
            while :; do sleep 1; done
            """ % self.tmp)
        job = self.start(["--standalone", "--shutdown_timeout=2", prog])
        self.wait_for_files(["ready_0"], job=job)
        time.sleep(0.1)
        sent = time.monotonic()
        job.signal(signal.SIGINT)
        time.sleep(1.0)
        self.assertIsNone(job.proc.poll(), "ddprun did not give the workers their grace period")
        res = job.wait()
        took = time.monotonic() - sent
        self.assert_exit(res, 128 + signal.SIGINT)
        self.assertGreaterEqual(took, 1.8, "the workers were killed before the 2 s grace ended\n" + res.describe())

    def test_signal_does_not_trigger_a_restart(self):
        # Workers stopped because ddprun was told to stop must not be restarted, budget or not.
        job = self.start(["--standalone", "--nproc_per_node=2", "--max_restarts=3", "--shutdown_timeout=20",
                          SH, worker("trap_signals.sh"), self.tmp, "1"])
        self.wait_for_files(["ready_0", "ready_1"], job=job)
        first_pids = (self.read("ready_0"), self.read("ready_1"))
        job.signal(signal.SIGTERM)
        res = job.wait(20)
        self.assert_exit(res, 128 + signal.SIGTERM)
        self.assertEqual((self.read("ready_0"), self.read("ready_1")), first_pids, "workers were restarted")

    def test_worker_exit_status_does_not_mask_signal_status(self):
        # Workers exit 3 when signalled; ddprun was stopped by SIGTERM, so it exits 143.
        job = self.start(["--standalone", "--nproc_per_node=2", "--shutdown_timeout=20",
                          SH, worker("trap_signals.sh"), self.tmp, "3"])
        self.wait_for_files(["ready_0", "ready_1"], job=job)
        job.signal(signal.SIGTERM)
        res = job.wait(20)
        self.assert_exit(res, 128 + signal.SIGTERM)
        self.assertEqual(self.read("sig_0").strip(), "TERM")
        self.assertEqual(self.read("sig_1").strip(), "TERM")


if __name__ == "__main__":
    main()
