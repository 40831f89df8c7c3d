"""A job that ends while its workers wait in the store must not hang the rendezvous.

Regression test: a 2-node job against ddprun-rdzv, where every rank but the last blocks in a store
wait for keys that never come and the last rank exits 3 with no restarts left. The job ends with
the waits pending. The daemon used to deadlock (its timer thread held the rendezvous lock while the
store failed the waits, whose callback took the same lock): it served no later job and ignored
SIGTERM. The same with the rendezvous hosted by an agent (is_host=1): that agent never exited.
Now: every agent exits with the worker's status, the daemon serves a new job, and SIGTERM stops it.
"""

import os
import signal

import multinode_lib as ml
from ddprun_testlib import main

TEST_BIN = os.environ.get("DDPRUN_TEST_BIN") or os.path.join(ml.REPO, "build", "test-bin")
WAITER = os.path.join(TEST_BIN, "store_waiter")
# Safety bounds (two shared cores, other tests running): a hang, not slowness, is what they catch.
JOB_END_S = 60
DAEMON_STOP_S = 15


class RendezvousTeardownTest(ml.MultiNodeTestCase):

    def setUp(self):
        super().setUp()
        self.assertTrue(os.access(WAITER, os.X_OK), "store_waiter not found at %s (set DDPRUN_TEST_BIN)" % WAITER)

    def job_with_pending_waits(self, port, conf_a=None, conf_b=None):
        a = self.agent("a", self.elastic_args(2, port, nproc=2, conf=conf_a) + [WAITER])
        if conf_a == "is_host=1":
            # b must not win the race to bind the endpoint: it starts once a hosts it.
            self.assertTrue(ml.wait_listening(port, proc=a.proc), "agent a did not host\n" + self.describe_all([a]))
        jobs = [a, self.agent("b", self.elastic_args(2, port, nproc=2, conf=conf_b) + [WAITER])]
        results = self.wait_all(jobs, JOB_END_S)
        for res in results:
            self.assert_exit(res, 3)  # the job's first failure, on every node
        self.assert_no_leftovers(jobs)
        return results

    def test_daemon_serves_and_stops_after_a_job_ends_with_waits_pending(self):
        port = ml.free_port()
        daemon = ml.Daemon(self, port)
        self.job_with_pending_waits(port)
        self.assertIsNone(daemon.poll(), "the daemon exited\n%s" % daemon.result(daemon.poll()).describe())

        # A later job on the same daemon rendezvouses and finishes.
        self.run_id += "_next"
        nxt = self.agent("c", self.elastic_args(1, port, nproc=1) + ["--no_python", "/bin/true"])
        self.assert_exit(nxt.wait(JOB_END_S), 0)

        daemon.kill(signal.SIGTERM)
        res = daemon.wait(DAEMON_STOP_S)
        self.assert_exit(res, 0)

    def test_hosting_agent_exits_after_a_job_ends_with_waits_pending(self):
        # Agent a hosts the rendezvous; both must exit with the worker's status within the bound.
        self.job_with_pending_waits(ml.free_port(), conf_a="is_host=1", conf_b="is_host=0")


if __name__ == "__main__":
    main()
