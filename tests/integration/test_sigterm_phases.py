"""A scheduler's SIGTERM (preemption, scancel, a pod deletion) ends ddprun in every phase of the
rendezvous, not only while workers run: while it connects to an endpoint nobody serves, while the
daemon refuses it at its connection cap, while it waits for a round, while it joins again after
losing the daemon, and on the etcd backend while etcd is unreachable or the round gathers. With no
worker running ddprun exits 143 within about a second; with workers, within --shutdown_timeout. In
every phase it leaves the rendezvous at once, so that its peers need not wait out a heartbeat
timeout.

Each case waits for something far longer than its bound (join_timeout 600 s, a 60 s rejoin window,
a 30 s etcd retry budget or lease): the bound is a safety timeout that tells a hang from an exit,
not a speed claim.
"""

import os
import signal
import socket
import time

import multinode_lib as ml
from ddprun_testlib import main
from etcd_cluster import EtcdCluster, etcd_available

# A hang lasts as long as the wait it is stuck in (tens to hundreds of seconds); an exit on
# SIGTERM takes a second here, more under load.
EXIT_BOUND_S = 10
SIGTERM_EXIT = 128 + signal.SIGTERM


class SigtermTestCase(ml.MultiNodeTestCase):
    def sigterm_and_wait(self, job, bound=EXIT_BOUND_S):
        job.kill(signal.SIGTERM)
        sent = time.monotonic()
        res = job.wait(bound + 20)  # a hang lasts minutes: it fails here, killed
        took = time.monotonic() - sent
        self.assertEqual(res.returncode, SIGTERM_EXIT, res.describe())
        self.assertLess(took, bound, "ddprun took %.1f s to exit on SIGTERM\n%s" % (took, res.describe()))
        return res


class SigtermPhasesTest(SigtermTestCase):
    def test_while_connecting_to_an_endpoint_nobody_serves(self):
        port = ml.free_port()
        job = self.agent("a", self.elastic_args(2, port, conf="is_host=0,join_timeout=600") + ["--no_python", "/bin/true"])
        time.sleep(2)  # in the connect wait
        self.assertIsNone(job.poll(), job.result(job.poll()).describe())
        self.sigterm_and_wait(job)
        self.assert_no_leftovers([job])

    def test_while_the_daemon_refuses_it_at_its_connection_cap(self):
        port = ml.free_port()
        ml.Daemon(self, port, extra=["--max_connections", "1"])
        hold = socket.create_connection(("127.0.0.1", port))  # the one connection the daemon keeps
        self.addCleanup(hold.close)
        time.sleep(0.3)
        job = self.agent("a", self.elastic_args(2, port, conf="is_host=0,join_timeout=600") + ["--no_python", "/bin/true"])
        time.sleep(2)
        self.assertIsNone(job.poll(), job.result(job.poll()).describe())
        self.sigterm_and_wait(job)

    def test_while_waiting_for_a_round_and_the_daemon_sees_it_leave(self):
        port = ml.free_port()
        daemon = ml.Daemon(self, port)
        job = self.agent("a", self.elastic_args(2, port, conf="join_timeout=600,heartbeat_timeout=30")
                         + ["--no_python", "/bin/true"])
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while "node " not in daemon.stderr() + daemon.stdout() or "joined" not in daemon.stderr() + daemon.stdout():
            self.assertLess(time.monotonic(), deadline, "the agent never joined\n%s" % job.result(job.poll()).describe())
            time.sleep(0.05)
        self.sigterm_and_wait(job)
        # The daemon heard it leave, not a missed heartbeat (30 s away).
        deadline = time.monotonic() + 5
        while "is gone" not in daemon.stderr() + daemon.stdout():
            self.assertLess(time.monotonic(), deadline, "the daemon did not see the node go\n" + daemon.stderr())
            time.sleep(0.05)
        self.assertNotIn("no heartbeat", daemon.stderr() + daemon.stdout())

    def test_while_joining_again_after_losing_the_daemon(self):
        port = ml.free_port()
        daemon = ml.Daemon(self, port)
        jobs = [self.agent(t, self.elastic_args(2, port, conf="join_timeout=600,heartbeat_timeout=30")
                           + [self.recorder()]) for t in "ab"]
        self.wait_records(lambda recs: len(recs) == 2, ml.SAFETY_TIMEOUT_S, jobs, "round 1 on both nodes")
        daemon.kill()  # SIGKILL: the agents stop their workers and try to join again for 2 x 30 s
        daemon.wait(ml.SAFETY_TIMEOUT_S)
        time.sleep(2)
        for j in jobs:
            self.assertIsNone(j.poll(), j.result(j.poll()).describe())
        # The workers stopped when the stream was lost; --shutdown_timeout=2 bounds them anyway.
        self.sigterm_and_wait(jobs[0], bound=EXIT_BOUND_S + 2)
        self.assert_no_leftovers(jobs[:1])


class EtcdSigtermPhasesTest(SigtermTestCase):
    def setUp(self):
        super().setUp()
        reason = etcd_available()
        if reason:
            self.skipTest(reason)

    def etcd_agent(self, endpoints, conf):
        args = ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=etcd", "--rdzv_endpoint=%s" % ",".join(endpoints),
                "--rdzv_id=%s" % self.run_id, "--local_addr=127.0.0.1", "--shutdown_timeout=2",
                "--rdzv_conf=%s,etcd_prefix=/ddprun-sigterm" % conf, "--no_python", "/bin/true"]
        return self.agent("a", args)

    def test_while_etcd_is_unreachable(self):
        # heartbeat_timeout=30: each etcd call may retry for 30 s before it gives up.
        job = self.etcd_agent(["127.0.0.1:%d" % ml.free_port()], "heartbeat_timeout=30,join_timeout=600")
        time.sleep(2)
        self.assertIsNone(job.poll(), job.result(job.poll()).describe())
        self.sigterm_and_wait(job)

    def test_while_the_round_gathers_its_etcd_key_goes_at_once(self):
        cluster = EtcdCluster(size=3)
        cluster.start()
        self.addCleanup(cluster.close)
        job = self.etcd_agent(cluster.endpoints, "heartbeat_timeout=30,join_timeout=600")
        nodes = "/ddprun-sigterm/run/%s/rdzv/nodes/" % self.run_id
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while not cluster.keys(nodes):
            self.assertLess(time.monotonic(), deadline, "the agent never wrote its node key\n%s" % job.result(job.poll()).describe())
            time.sleep(0.05)
        self.sigterm_and_wait(job)
        # Its lease is revoked, not left to expire (30 s): the key is gone now.
        self.assertEqual(cluster.keys(nodes), [])


if __name__ == "__main__":
    main()
