"""Exit status and failure summary: ddprun's exit status is the first failing worker's (128+N for
a signal), the siblings are stopped promptly, and the summary on stderr names the failure."""

import json
import os
import shutil
import signal
import subprocess

from ddprun_testlib import DDPRUN, SAFETY_TIMEOUT_S, SH, DdprunTestCase, hostname, main

# A sibling that would keep ddprun waiting for ten minutes if it were not stopped: a ddprun that
# waits for it instead of stopping it fails by the safety timeout (SAFETY_TIMEOUT_S), and one that
# leaves it running fails the leak check of run_job.
SLEEPER = "exec sleep 600"
SIBLING_STOPPED = "the sibling sleeps 600 s unless ddprun stops it"


class ExitCodeTest(DdprunTestCase):
    def test_all_workers_succeed_exit_0(self):
        prog = self.script("ok.sh", 'echo "done $RANK" > "%s/done_$RANK"\nexit 0\n' % self.tmp)
        res = self.run_job(["--standalone", "--nproc_per_node=3", prog])
        self.assert_exit(res, 0)
        for r in range(3):
            self.assertEqual(self.read("done_%d" % r).strip(), "done %d" % r)
        self.assertNotIn("FAILED", res.stderr)

    def test_failing_worker_exit_code_and_sibling_stopped(self):
        prog = self.script("fail.sh", """
            if [ "$LOCAL_RANK" = 1 ]; then exit 42; fi
            %s
            """ % SLEEPER)
        res = self.run_job(["--standalone", "--nproc-per-node", "2", prog], why=SIBLING_STOPPED)
        self.assert_exit(res, 42)

    def test_worker_killed_by_signal_gives_128_plus_signal(self):
        for sig, name in ((signal.SIGKILL, "SIGKILL"), (signal.SIGSEGV, "SIGSEGV")):
            with self.subTest(signal=name):
                prog = self.script("sig_%d.sh" % sig, """
                    if [ "$LOCAL_RANK" = 0 ]; then kill -%d $$; fi
                    %s
                    """ % (sig, SLEEPER))
                res = self.run_job(["--standalone", "--nproc_per_node=2", prog], why=SIBLING_STOPPED)
                self.assert_exit(res, 128 + sig)
                self.assertIn(name, res.stderr, res.describe())

    def test_first_failure_wins_when_later_rank_fails_first(self):
        # Rank 1 fails at once with 3; rank 0 would exit 5 when it is stopped. 3 is the answer.
        prog = self.script("first.sh", """
            if [ "$LOCAL_RANK" = 1 ]; then exit 3; fi
            trap 'exit 5' TERM INT
            while :; do sleep 60 & wait $!; done
            """)
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog])
        self.assert_exit(res, 3)
        self.assertRegex(res.stderr, r"rank\s*:\s*1\b", res.describe())

    def test_first_failure_wins_when_rank_0_fails_first(self):
        # The mirror case, so that neither "lowest rank" nor "last exit" can pass by accident.
        prog = self.script("first0.sh", """
            if [ "$LOCAL_RANK" = 0 ]; then exit 4; fi
            trap 'exit 9' TERM INT
            while :; do sleep 60 & wait $!; done
            """)
        res = self.run_job(["--standalone", "--nproc_per_node=3", prog])
        self.assert_exit(res, 4)

    def test_exit_code_of_single_worker(self):
        res = self.run_job(["--standalone", SH, "-c", "exit 17"])
        self.assert_exit(res, 17)


class FailureSummaryTest(DdprunTestCase):
    def test_summary_names_rank_pid_exit_host_error_file_and_stderr_tail(self):
        message = "CUDA out of memory in layer 7 (integration check)"
        callstack = "Traceback-like text: File train.py, line 12, in step"
        error = {"message": {"message": message,
                             "extraInfo": {"py_callstack": callstack, "timestamp": "1700000000"}}}
        self.write_file("error.json", json.dumps(error))
        prog = self.script("summary.sh", """
            if [ "$LOCAL_RANK" = 1 ]; then
              echo $$ > "%(d)s/pid_1"
              cp "%(d)s/error.json" "$TORCHELASTIC_ERROR_FILE"
              i=1
              while [ $i -le 30 ]; do echo "stderr line $i of rank 1" >&2; i=$((i+1)); done
              echo "LAST-STDERR-LINE before dying" >&2
              exit 13
            fi
            %(sleeper)s
            """ % {"d": self.tmp, "sleeper": SLEEPER})
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog])
        self.assert_exit(res, 13)
        err = res.stderr
        pid = self.read("pid_1").strip()
        self.assertRegex(err, r"rank\s*:\s*1\b", res.describe())
        self.assertRegex(err, r"local_rank\s*:\s*1\b", res.describe())
        self.assertIn(pid, err, "worker pid missing\n" + res.describe())
        self.assertRegex(err, r"exit ?code\s*:\s*13\b", res.describe())
        self.assertIn(hostname(), err, "host missing\n" + res.describe())
        self.assertIn(message, err, "TORCHELASTIC_ERROR_FILE message missing\n" + res.describe())
        self.assertIn("LAST-STDERR-LINE before dying", err, "stderr tail missing\n" + res.describe())
        self.assertIn("stderr line 30 of rank 1", err, res.describe())
        self.assert_no_crash_text(err, res)

    def test_summary_has_stderr_tail_even_when_stderr_is_redirected(self):
        prog = self.script("redir.sh", """
            if [ "$LOCAL_RANK" = 0 ]; then echo "reason: disk quota exceeded" >&2; exit 11; fi
            %s
            """ % SLEEPER)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--redirects=3", "--log_dir", self.path("logs"),
                            prog])
        self.assert_exit(res, 11)
        self.assertIn("reason: disk quota exceeded", res.stderr, res.describe())
        self.assertNotIn("[default0]:reason", res.stderr, "redirected stderr reached the console\n" + res.describe())

    def test_summary_names_signal(self):
        prog = self.script("killed.sh", """
            if [ "$LOCAL_RANK" = 0 ]; then echo "about to be killed" >&2; kill -9 $$; fi
            %s
            """ % SLEEPER)
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog])
        self.assert_exit(res, 137)
        self.assertIn("SIGKILL", res.stderr, res.describe())
        self.assertRegex(res.stderr, r"rank\s*:\s*0\b", res.describe())
        self.assertIn("about to be killed", res.stderr, res.describe())
        self.assert_no_crash_text(res.stderr, res)

    def test_error_file_written_by_python_worker(self):
        # An unmodified Python worker writing torchrun's error file format itself.
        prog = self.write_file("err.py", """
            import json, os, sys, time
            if os.environ["LOCAL_RANK"] == "0":
                with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
                    json.dump({"message": {"message": "ValueError: bad batch size 0",
                                           "extraInfo": {"py_callstack": "File x.py line 1",
                                                         "timestamp": str(int(time.time()))}}}, f)
                sys.exit(2)
            time.sleep(600)
            """)
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog], why=SIBLING_STOPPED)
        self.assert_exit(res, 2)
        self.assertIn("ValueError: bad batch size 0", res.stderr, res.describe())
        self.assertRegex(res.stderr, r"rank\s*:\s*0\b", res.describe())

    def test_worker_that_cannot_be_executed(self):
        # Executable, but its interpreter does not exist: exec fails in every worker.
        prog = self.write_file("badinterp.sh", "#!/nonexistent/interpreter-for-ddprun-test\necho hi\n",
                               executable=True)
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog])
        self.assert_exit(res, 127)
        self.assertIn("FAILED", res.stderr, res.describe())
        self.assertRegex(res.stderr, r"rank\s*:\s*0\b", res.describe())
        self.assert_no_crash_text(res.stderr, res)

    def test_a_local_reason_is_exit_1_with_one_line(self):
        # README's exit status 1: ddprun cannot run the job on this node for a reason of its own
        # machine, here a multi-node job whose ddprun-multinode is not installed next to ddprun.
        alone = self.path("alone")
        os.mkdir(alone)
        shutil.copy(DDPRUN, alone)
        res = subprocess.run([os.path.join(alone, "ddprun"), "--nnodes=2", "--node_rank=1", "--master_addr=127.0.0.1",
                              "/bin/true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=SAFETY_TIMEOUT_S)
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertIn("multi-node jobs need", res.stderr)
        self.assertEqual(len(res.stderr.strip().splitlines()), 1, res.stderr)

    def test_no_exception_text_when_program_cannot_start_in_a_worker(self):
        # A worker whose exec fails (status 127) is an expected failure: a summary, no stack trace.
        prog = self.script("noexec.sh", "exec /nonexistent/interpreter-for-ddprun-test\n")
        res = self.run_job(["--standalone", prog])
        self.assert_exit(res, 127)
        self.assert_no_crash_text(res.stderr, res)
        self.assertIn("127", res.stderr, res.describe())


if __name__ == "__main__":
    main()
