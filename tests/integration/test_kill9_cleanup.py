"""kill -9 of ddprun: besides the workers (test_no_leaks), the run's temporary folder (error files,
per-round store) must not be left behind; the watchdog removes it. A --log_dir the user asked for
is theirs and stays."""

import glob
import os
import signal
import time

from ddprun_testlib import DdprunTestCase, main


class Kill9CleanupTest(DdprunTestCase):
    def start_and_kill(self, extra_args, tmpdir):
        os.makedirs(tmpdir)
        prog = self.script("ready.sh", 'touch "%s/ready_$RANK"\nexec sleep 60\n' % self.tmp)
        job = self.start(["--standalone", "--nproc_per_node=2"] + extra_args + [prog], env={"TMPDIR": tmpdir})
        self.wait_for_files(["ready_0", "ready_1"], job=job)
        job.signal(signal.SIGKILL)
        job.wait(10)
        self.assert_no_survivors(job)

    def test_temporary_run_folder_is_removed_after_kill_9(self):
        tmpdir = self.path("tmpdir")
        self.start_and_kill([], tmpdir)
        deadline = time.monotonic() + 2
        while glob.glob(os.path.join(tmpdir, "ddprun_*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertEqual(glob.glob(os.path.join(tmpdir, "ddprun_*")), [], "the run folder outlived kill -9 by 2 s")

    def test_log_dir_is_kept_after_kill_9(self):
        tmpdir = self.path("tmpdir")
        logs = self.path("logs")
        self.start_and_kill(["--log_dir", logs], tmpdir)
        time.sleep(0.3)
        self.assertTrue(glob.glob(os.path.join(logs, "*", "attempt_0", "0", "stdout.log")), "--log_dir was removed")


if __name__ == "__main__":
    main()
