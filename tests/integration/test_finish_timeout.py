"""--finish_timeout: once a rank of the job has exited 0, every other rank must exit within the bound;
past it the job is hung (seed 001: some ranks ran out of data and left, the others wait for them
for good). ddprun then takes the Python stack of every rank still running, stops them, and exits
124 naming the finished ranks and the ranks still running.

On gloo a peer's exit breaks the collective at once; the seed's hang is NCCL's, and that of any
wait a peer's exit does not break. So here rank 0 waits on the job's TCPStore (it hosts it) for a
key that rank 1, which exits 0, never sets. Workers are real torch 1.13 processes. The safety
timeouts are far below the 600 s store timeout the waiting rank would otherwise sit out."""

import json
import os
import re

import multinode_lib as ml
from ddprun_testlib import PYTHON_EXEC, DdprunTestCase, main
from hang_workers import UNEVEN

PYTHON = PYTHON_EXEC  # the interpreter with torch: Debian's 1.13, or the torch 2.x tier's (tests/torch2)

# Rank 1 leaves at once; rank 0 runs an epilogue longer than the bound (a final checkpoint) and
# says so with heartbeats: it must not be killed.
BEATING_EPILOGUE = r'''
import os, sys, time
import ddprun
if os.environ["RANK"] == "0":
    with ddprun.section("final_checkpoint"):
        for _ in range(int(float(sys.argv[1]) / 0.25)):
            ddprun.heartbeat()
            time.sleep(0.25)
    open(os.path.join(sys.argv[2], "epilogue_done"), "w").close()
'''

# Not a Python process: no stack can be taken; it is stopped all the same.
SHELL_WAITER = r'''#!/bin/sh
if [ "$RANK" = "1" ]; then exit 0; fi
exec sleep 600
'''

WHY = "rank 0 waits 600 s on the store unless --finish_timeout catches it"


class FinishTimeoutTest(DdprunTestCase):
    def test_seed_001_hang_ends_with_124_and_the_waiting_stack(self):
        prog = self.write_file("uneven.py", UNEVEN)
        logs = self.path("logs")
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--finish_timeout=3", "--log_dir", logs,
                            PYTHON, prog, "1"], why=WHY)
        self.assert_exit(res, 124)
        out = res.describe()
        # The stack of the rank still running, with the function it waits in.
        self.assertIn("wait_for_peer_that_left", res.stderr, out)
        # The verdict names who finished, who did not, and what it usually means.
        self.assertRegex(res.stderr, r"finished: rank 1\b", out)
        self.assertRegex(res.stderr, r"still running: rank 0\b", out)
        self.assertIn("uneven inputs", res.stderr, out)
        self.assertIn("torch.distributed.algorithms.Join", res.stderr, out)
        # The error file of the hung rank holds the diagnosis and the stack, in torchrun's format.
        error_file = os.path.join(logs, os.listdir(logs)[0], "attempt_0", "0", "error.json")
        with open(error_file) as f:
            err = json.load(f)["message"]
        self.assertIn("--finish_timeout", err["message"], out)
        self.assertIn("wait_for_peer_that_left", err["extraInfo"]["py_callstack"], out)

    def test_a_rank_that_beats_in_its_epilogue_is_not_hung(self):
        prog = self.write_file("epilogue.py", BEATING_EPILOGUE)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--finish_timeout=1", PYTHON, prog, "3",
                            self.tmp])
        self.assert_exit(res, 0)
        self.assertEqual(self.read("epilogue_done"), "")

    def test_an_epilogue_within_the_bound_is_not_hung(self):
        prog = self.script("short.sh", 'if [ "$RANK" = "0" ]; then sleep 1; fi')
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--finish_timeout=20", prog])
        self.assert_exit(res, 0)
        self.assertNotIn("hung", res.stderr, res.describe())

    def test_a_program_that_is_not_python_is_stopped_without_a_stack(self):
        prog = self.write_file("waiter.sh", SHELL_WAITER, executable=True)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--finish_timeout=1", prog], why=WHY)
        self.assert_exit(res, 124)
        self.assertIn("no Python stack", res.stderr, res.describe())
        self.assertRegex(res.stderr, r"still running: rank 0\b", res.describe())

    def test_zero_turns_it_off_and_bad_values_are_refused(self):
        prog = self.script("short.sh", 'if [ "$RANK" = "0" ]; then sleep 1.5; fi')
        self.assert_exit(self.run_job(["--standalone", "--nproc_per_node=2", "--finish_timeout=0", prog]), 0)
        for bad in ("-1", "x", "1e9"):
            res = self.run_job(["--standalone", "--finish_timeout=" + bad, prog])
            self.assert_exit(res, 2)
            self.assertIn("--finish_timeout", res.stderr, res.describe())

    def test_a_restart_gets_a_fresh_bound(self):
        # A hang within the budget restarts the group; the next attempt runs evenly and succeeds.
        prog = self.write_file("uneven.py", UNEVEN)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--finish_timeout=2", "--max_restarts=1",
                            PYTHON, prog, "1", "1"], why=WHY)
        self.assert_exit(res, 0)
        self.assertIn("wait_for_peer_that_left", res.stderr, res.describe())


class FinishTimeoutAcrossNodesTest(ml.MultiNodeTestCase):
    def test_a_rank_that_finished_on_another_node_starts_the_bound(self):
        # Node a holds rank 0, which waits; node b's rank 1 leaves. Node a hears of it through the
        # rendezvous and ends the job; both agents exit 124.
        port = ml.free_port()
        ml.Daemon(self, port)
        prog = self.write_file("uneven.py", UNEVEN)
        jobs = [self.agent(t, self.elastic_args(2, port, extra=("--finish_timeout=3",)) + [PYTHON, prog, "1"])
                for t in ("a", "b")]
        results = self.wait_all(jobs, 90)
        described = self.describe_all(jobs)
        self.assertEqual([r.returncode for r in results], [124, 124], described)
        waiting = [r for r in results if "wait_for_peer_that_left" in r.stderr]
        self.assertEqual(len(waiting), 1, described)
        self.assertRegex(waiting[0].stderr, r"still running: rank 0\b", described)
        self.assertTrue(re.search(r"finished: .*rank 1\b", waiting[0].stderr), described)
        self.assert_no_leftovers(jobs)


if __name__ == "__main__":
    main()
