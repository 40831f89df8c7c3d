"""An agent that loses its rendezvous stream joins again (agents on loopback, one ddprun-rdzv).

Agent a reaches the daemon through a TCP proxy that the test controls; agent b connects directly.
- The proxy drops every connection once (a connection reset, a restarted load balancer): a stops
  its workers and joins again; both nodes run the next round together, without spending the
  restart budget, and the job ends with 0.
- The proxy stops for good: a tries to join again for 2 x heartbeat_timeout, then fails with a
  clear error; b, below --nnodes' minimum, fails after join_timeout; both exit with the
  infrastructure-failure code (200). Nothing is left behind.
- Static mode (node 0 hosts, node 1 behind the proxy): after a reset node 1 joins again with its
  --node_rank and the ranks stay where they were.

Time limits are safety timeouts (SAFETY_TIMEOUT_S), not speed claims.
"""

import socket
import threading

import multinode_lib as ml
from ddprun_testlib import main

HEARTBEAT_S = 1


class CuttableProxy:
    """Forwards TCP connections from a port of its own to target_port on loopback."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.sockets = []
        self.accepted = 0
        self.running = True
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self):
        while self.running:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, upstream]
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        """Resets every open connection; new ones are still accepted."""
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for s in sockets:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()  # linger 0: an RST, as a dropped connection looks to both ends
            except OSError:
                pass

    def stop(self):
        self.running = False
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept(), so the port stops listening
        except OSError:
            pass
        self.listener.close()
        self.cut()


class RejoinTest(ml.MultiNodeTestCase):

    def start(self, extra_conf=""):
        self.daemon = ml.Daemon(self, ml.free_port())
        self.proxy = CuttableProxy(self.daemon.port)
        self.addCleanup(self.proxy.stop)
        prog = self.recorder()
        conf = "heartbeat_timeout=%d,is_host=0%s" % (HEARTBEAT_S, extra_conf)
        a = self.agent("a", self.elastic_args(2, self.proxy.port, nproc=2, conf=conf, extra=["--max_restarts=0"]) + [prog])
        b = self.agent("b", self.elastic_args(2, self.daemon.port, nproc=2, conf=conf, extra=["--max_restarts=0"]) + [prog])
        jobs = [a, b]
        self.wait_records(lambda recs: any(ml.round_complete(recs, rn, "ab", 2, 4) for rn in {r["round"] for r in recs}),
                          20, jobs, "the first round of both agents")
        first = max(r["round"] for r in self.records())
        return jobs, first

    def test_dropped_connection_rejoins_next_round(self):
        jobs, first = self.start()
        connections = self.proxy.accepted
        self.proxy.cut()
        self.wait_records(
            lambda recs: any(rn > first and ml.round_complete(recs, rn, "ab", 2, 4) for rn in {r["round"] for r in recs}),
            ml.SAFETY_TIMEOUT_S, jobs, "a round of both agents after the cut")
        self.assertGreater(self.proxy.accepted, connections, "agent a never connected again")
        recs = self.records()
        again = max(r["round"] for r in recs)
        mine = [r for r in recs if r["round"] == again]
        self.assertEqual(sorted(r["rank"] for r in mine), [0, 1, 2, 3], recs)
        # With --max_restarts=0 a restart would have ended the job: a lost stream is membership.
        self.assertEqual({r["restart"] for r in recs}, {0}, recs)
        self.assertIn("joining again", jobs[0].stderr(), jobs[0].result(jobs[0].proc.poll()).describe())
        self.release()
        for res in self.wait_all(jobs, 20):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)

    def test_rendezvous_gone_for_good_fails_cleanly(self):
        jobs, _ = self.start(",join_timeout=3")
        self.proxy.stop()
        a, b = jobs
        # The workers hold for 60 s: agents that went on without the rendezvous miss the timeout.
        res_a = a.wait(ml.SAFETY_TIMEOUT_S)
        self.assertEqual(res_a.returncode, ml.EXIT_INFRASTRUCTURE, res_a.describe())
        self.assertIn("could not join again within %ds" % (2 * HEARTBEAT_S), res_a.stderr, res_a.describe())
        self.assert_no_crash_text(res_a.stderr, res_a)
        res_b = b.wait(ml.SAFETY_TIMEOUT_S)
        self.assertEqual(res_b.returncode, ml.EXIT_INFRASTRUCTURE, res_b.describe())
        self.assert_no_crash_text(res_b.stderr, res_b)
        self.assert_no_leftovers(jobs)

    def test_static_node_rejoins_with_its_rank(self):
        # Static mode: node 0 hosts the rendezvous at --master_port; node 1 reaches it through the
        # proxy. After the cut, node 1 joins again under the same --node_rank (which the server
        # may still hold for the old stream for a moment: retried, not fatal).
        port = ml.free_port()
        conf = "--rdzv_conf=heartbeat_timeout=%d" % HEARTBEAT_S
        prog = self.recorder()

        def static(rank, p):
            return ["--nnodes=2", "--node_rank=%d" % rank, "--master_addr=127.0.0.1", "--master_port=%d" % p,
                    "--nproc_per_node=2", "--shutdown_timeout=2", conf, prog]

        n0 = self.agent("n0", static(0, port))
        self.assertTrue(ml.wait_listening(port, proc=n0.proc), "node 0 does not host the rendezvous\n" + self.describe_all([n0]))
        self.proxy = CuttableProxy(port)
        self.addCleanup(self.proxy.stop)
        n1 = self.agent("n1", static(1, self.proxy.port))
        jobs = [n0, n1]
        both = lambda after: lambda recs: any(
            rn > after and ml.round_complete(recs, rn, ["n0", "n1"], 2, 4) for rn in {r["round"] for r in recs})
        self.wait_records(both(0), 20, jobs, "the first round of both nodes")
        first = max(r["round"] for r in self.records())
        self.proxy.cut()
        self.wait_records(both(first), ml.SAFETY_TIMEOUT_S, jobs, "a round of both nodes after the cut")
        recs = self.records()
        again = [r for r in recs if r["round"] == max(x["round"] for x in recs)]
        self.assertEqual(sorted((r["node"], r["rank"]) for r in again),
                         [("n0", 0), ("n0", 1), ("n1", 2), ("n1", 3)], "static ranks moved: %s" % recs)
        self.assertEqual({r["restart"] for r in recs}, {0}, recs)
        self.assertIn("joining again", n1.stderr(), self.describe_all(jobs))
        self.release()
        for res in self.wait_all(jobs, 20):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)


if __name__ == "__main__":
    main()
