"""Frozen and killed processes under a running job, on loopback (no root needed).

Every case runs an elastic job on ddprun-rdzv (heartbeat_timeout HEARTBEAT_S) with workers that
record their lives (chaos_lib.LIFE_WORKER), injects one fault, and checks:
  - the invariants of chaos_lib.check_lives (no two rounds with workers alive at once, unique
    ranks per round);
  - every agent ends with a documented exit code (0, or the infrastructure-failure code) within
    the safety bound;
  - no process of any agent is left, and no worker beats after its agent ended.
Faults: the daemon SIGKILLed mid-job; the daemon frozen (SIGSTOP) shorter and longer than the
heartbeat timeout; one agent frozen for 3 x the heartbeat timeout while its workers run on (its
watchdog fences them; the agent joins again after SIGCONT).
"""

import os
import signal
import sys
import time

import chaos_lib as cl
from chaos_lib import ml
from ddprun_testlib import main

HEARTBEAT_S = 2
HOLD_S = 60  # a worker's own bound; the tests release them much earlier


class ProcessFaultsTest(cl.ChaosTestCase):

    def start_job(self, nodes, nnodes=None, conf_extra=""):
        port = ml.free_port()
        self.daemon = ml.Daemon(self, port, log_level="info")
        life = self.write_file("life.py", cl.LIFE_WORKER)
        conf = "is_host=0,heartbeat_timeout=%d,last_call_timeout=0.5%s" % (HEARTBEAT_S, conf_extra)
        jobs = [self.agent(t, self.elastic_args(nnodes or len(nodes), port, nproc=2, conf=conf) +
                           ["--max_restarts=3", sys.executable, life, self.tmp, str(HOLD_S)]) for t in nodes]
        self.wait_lives(lambda lives: {lv["node"] for lv in lives if lv["round"] == 1} == set(nodes), jobs,
                        "round 1 on every node")
        return jobs

    def finish(self, jobs, allowed, release=True):
        if release:
            self.release()
        results = self.wait_all(jobs, ml.SAFETY_TIMEOUT_S)
        for res in results:
            self.assertIn(res.returncode, allowed, "undocumented exit\n" + res.describe())
        self.assert_no_leftovers(jobs)
        lives = cl.check_lives(self, self.tmp)
        ended = time.monotonic()
        time.sleep(3 * cl.BEAT_S)
        for lv in cl.read_lives(self.tmp):
            self.assertLess(lv["last"], ended, "worker pid %d beats after every agent ended" % lv["pid"])
        return results, lives

    def test_daemon_killed_mid_job(self):
        jobs = self.start_job("ab")
        self.daemon.kill(signal.SIGKILL)
        # Each agent loses the rendezvous, stops its workers, tries to join again for
        # 2 x heartbeat_timeout and then gives up with the infrastructure-failure code.
        results, _ = self.finish(jobs, {ml.EXIT_INFRASTRUCTURE}, release=False)
        for res in results:
            self.assertIn("lost the rendezvous", res.stderr)

    def test_daemon_frozen_shorter_than_the_heartbeat_timeout(self):
        jobs = self.start_job("ab")
        self.daemon.kill(signal.SIGSTOP)
        time.sleep(HEARTBEAT_S / 4)
        self.daemon.kill(signal.SIGCONT)
        time.sleep(HEARTBEAT_S)
        _, lives = self.finish(jobs, {0})
        self.assertEqual({lv["round"] for lv in lives}, {1}, "a short freeze of the daemon restarted the job")

    def test_daemon_frozen_longer_than_the_heartbeat_timeout(self):
        jobs = self.start_job("ab")
        self.daemon.kill(signal.SIGSTOP)
        time.sleep(1.5 * HEARTBEAT_S)
        self.daemon.kill(signal.SIGCONT)
        # The agents lost the daemon and join again within 2 x heartbeat_timeout: a new round on
        # both nodes (or, on a slow machine, the infrastructure-failure exit).
        self.wait_lives(lambda lives: any(lv["round"] > 1 for lv in lives) or any(j.poll() is not None for j in jobs),
                        jobs, "a new round after the daemon came back")
        self.finish(jobs, {0, ml.EXIT_INFRASTRUCTURE})

    def test_agent_frozen_while_its_workers_run(self):
        jobs = self.start_job("abc", nnodes="2:3")
        frozen = jobs[2]
        frozen.kill(signal.SIGSTOP)
        try:
            # The daemon drops c after heartbeat_timeout and a and b go on in a new round. The
            # fencing invariant (chaos_lib) requires c's round-1 workers to be gone by then.
            self.wait_lives(lambda lives: {lv["node"] for lv in lives if lv["round"] > 1} >= {"a", "b"},
                            jobs[:2], "a new round on a and b")
            time.sleep(HEARTBEAT_S)
        finally:
            frozen.kill(signal.SIGCONT)
        # Its watchdog fenced c's workers while c was frozen; on waking, c learns that it is out
        # and joins again as a newcomer (#12 §3), instead of exiting 1. Which it notices first
        # is a race of two threads: the server's EVICTED answer ("declared this node dead"), or
        # its own heartbeat thread finding the last answer too old ("fencing round 1").
        self.wait_lives(lambda lives: any(lv["node"] == "c" and lv["round"] > 1 for lv in lives), jobs,
                        "c joining again after the freeze")
        results, _ = self.finish(jobs, {0})
        self.assertRegex(results[2].stderr, "declared this node dead|fencing round 1", results[2].describe())


if __name__ == "__main__":
    main()
