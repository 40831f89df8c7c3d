"""Multi-node over real separate network stacks: three hosts made of Linux network namespaces.

Topology (all names carry this process's id, so parallel runs never collide):
    ddpt_<pid>_br : a bridge ddbr0 (plus lo)
    ddpt_<pid>_a  : veth 192.0.2.1/24  --  its peer on the bridge
    ddpt_<pid>_b  : veth 192.0.2.2/24  --  its peer on the bridge
    ddpt_<pid>_c  : veth 192.0.2.3/24  --  its peer on the bridge
One ddprun agent runs in each host namespace (elastic, --nnodes=2:3, endpoint 192.0.2.1:PORT, which
agent a hosts because only its namespace has that address; heartbeat_timeout=2). Host c is then cut
off by setting its bridge port down: no FIN, no RST, only silence. The others must notice through
the missed heartbeats and restart their workers into a smaller round: the round is interrupted
because host c "left: no heartbeat for 2.0s" (the reason the agents log), not because its
connection failed (gRPC's TCP user timeout drops it after about 20 s, which a time bound under
load could not tell apart). The cut-off agent must not keep its workers running (it loses the
rendezvous, stops them and exits 1). Time limits are safety timeouts, not speed claims.

Every namespace (and with it every veth and the bridge) is deleted at the end, also on failure.
The test needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); where namespaces cannot be created it FAILS.
"""

import multinode_lib as ml
from ddprun_testlib import main
from netns_lib import make_test_hosts

HEARTBEAT_S = 2


class NetnsTest(ml.MultiNodeTestCase):

    def setUp(self):
        super().setUp()
        self.hosts = make_test_hosts(self, ["a", "b", "c"])

    def test_partitioned_host_is_dropped_after_heartbeat_timeout(self):
        h = self.hosts
        port = ml.free_port()  # any port: the namespaces are fresh
        prog = self.recorder()
        conf = "heartbeat_timeout=%d,last_call_timeout=10" % HEARTBEAT_S
        agents = {}
        for t in ("a", "b", "c"):  # a first: it owns 192.0.2.1, so it hosts the endpoint
            agents[t] = self.agent(t, self.elastic_args("2:3", port, nproc=2, conf=conf, host=h.addr["a"],
                                                        # rank 0's store: MASTER_ADDR is then the
                                                        # host of group rank 0 as the others reach it
                                                        extra=["--log_level=info", "--torch_store=rank0"]) + [prog],
                                   prefix=h.exec_prefix(t))
        jobs = list(agents.values())

        def round_with(nodes, after=0):
            world = 2 * len(nodes)
            return lambda recs: any(rn > after and ml.round_complete(recs, rn, nodes, 2, world)
                                    for rn in {r["round"] for r in recs})

        self.wait_records(round_with("abc"), 30, jobs, "a round of the three hosts")
        recs = self.records()
        round1 = max(rn for rn in {r["round"] for r in recs} if ml.round_complete(recs, rn, "abc", 2, 6))
        first = [r for r in recs if r["round"] == round1]
        self.assertEqual(sorted(r["rank"] for r in first), list(range(6)), recs)
        # MASTER_ADDR is the real address of the host of group rank 0, as the others reach it.
        master_node = next(r["node"] for r in first if r["group_rank"] == 0)
        self.assertEqual({r["master_addr"] for r in first}, {h.addr[master_node]}, recs)

        h.cut("c")
        self.wait_records(round_with("ab", after=round1), ml.SAFETY_TIMEOUT_S, jobs[:2],
                          "the connected hosts to restart without host c (heartbeat_timeout=%ds)" % HEARTBEAT_S)
        for t in "ab":
            self.assertRegex(agents[t].stderr(), r"interrupted: node \S+ left: no heartbeat for %d\.0s" % HEARTBEAT_S,
                             "host %s's round was not interrupted by the missed heartbeats of host c\n%s"
                             % (t, self.describe_all(jobs)))
        recs = self.records()
        new = [r for r in recs if r["round"] > round1]
        self.assertEqual({r["node"] for r in new}, {"a", "b"}, recs)
        self.assertEqual({(r["world"], r["group_world"], r["restart"]) for r in new}, {(4, 2, 0)}, recs)
        self.assertEqual(sorted(r["rank"] for r in new), [0, 1, 2, 3], recs)

        # The cut-off host cannot reach its rendezvous: it must stop its workers and fail by itself.
        res_c = agents["c"].wait(ml.SAFETY_TIMEOUT_S)
        self.assertEqual(res_c.returncode, ml.EXIT_INFRASTRUCTURE,
                         "the partitioned agent must fail with the infrastructure code\n" + res_c.describe())
        self.assertEqual(agents["c"].survivors(grace=3.0), [], "workers of the partitioned host kept running")

        self.release()
        for res in self.wait_all(jobs[:2], 15):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)


if __name__ == "__main__":
    main()
