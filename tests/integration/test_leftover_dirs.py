"""No run folder outlives its job, whichever way the job ends.

ddprun keeps per-attempt files (error files, the single-node store) in a folder under $TMPDIR
(ddprun_XXXXXX) unless --log_dir asks to keep them. Every exit path must remove it: success,
worker failure, SIGTERM, a second SIGINT, a hung rank, SIGKILL of ddprun itself (its watchdog
removes the folder), and the same for a multi-node agent that hosts the rendezvous. Each job gets
a $TMPDIR of its own, which must be empty once the job and its watchdog are gone.
"""

import os
import signal
import time

import ddprun_testlib as tl
import multinode_lib as ml
from ddprun_testlib import main

END_S = 60  # safety bound


class LeftoverDirsTest(tl.DdprunTestCase):

    def job(self, args, **kw):
        self.tmpdir = self.path("tmp_%d" % len(os.listdir(self.tmp)))
        os.makedirs(self.tmpdir)
        return self.start(args, env={"TMPDIR": self.tmpdir}, **kw)

    def assert_no_leftovers(self, job):
        self.assert_no_survivors(job)  # the watchdog too, after its grace
        self.assertEqual(os.listdir(self.tmpdir), [], "a run folder outlived the job")

    def sleeper(self):
        return self.script("sleeper.sh", 'touch "%s/started_$RANK"; exec sleep 60\n' % self.tmp)

    def wait_started(self, job, n=2):
        self.wait_for_files(["started_%d" % r for r in range(n)], job=job)

    def test_success_and_failure(self):
        for prog, code in (("/bin/true", 0), ("/bin/false", 1)):
            job = self.job(["--nproc_per_node=2", "--max_restarts=1", "--no_python", prog])
            self.assert_exit(job.wait(END_S), code)
            self.assert_no_leftovers(job)

    def test_signals(self):
        for sigs, code in (((signal.SIGTERM,), 128 + signal.SIGTERM), ((signal.SIGINT, signal.SIGINT), 128 + signal.SIGINT)):
            for name in os.listdir(self.tmp):
                if name.startswith("started_"):
                    os.remove(self.path(name))
            job = self.job(["--nproc_per_node=2", "--shutdown_timeout=5", self.sleeper()])
            self.wait_started(job)
            for s in sigs:
                job.signal(s)
            self.assert_exit(job.wait(END_S), code)
            self.assert_no_leftovers(job)

    def test_sigkill_of_ddprun(self):
        job = self.job(["--nproc_per_node=2", self.sleeper()])
        self.wait_started(job)
        job.signal(signal.SIGKILL)
        job.wait(END_S)
        deadline = time.monotonic() + 10
        while os.listdir(self.tmpdir) and time.monotonic() < deadline:
            time.sleep(0.05)  # the watchdog removes it once it has killed the workers
        self.assert_no_leftovers(job)

    def test_multinode_host_success_and_sigterm(self):
        port = ml.free_port()
        args = ["--nnodes=1", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_id=leftovers"]
        job = self.job(args + ["--no_python", "/bin/true"])
        self.assert_exit(job.wait(END_S), 0)
        self.assert_no_leftovers(job)
        job = self.job(args + ["--nproc_per_node=2", "--shutdown_timeout=5", self.sleeper()])
        self.wait_started(job)
        job.signal(signal.SIGTERM)
        self.assert_exit(job.wait(END_S), 128 + signal.SIGTERM)
        self.assert_no_leftovers(job)


if __name__ == "__main__":
    main()
