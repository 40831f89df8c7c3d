"""Multi-node jobs on one machine: every node is a separate ddprun agent on loopback.

- Static mode (--nnodes=2 --node_rank=R --master_addr --master_port): node 0 hosts the rendezvous;
  an unmodified PyTorch DDP script trains with world size 4 over 2 agents and ends with the same
  weights as a single-node --standalone run with 4 workers. A recording shell worker checks the
  contract across nodes (ranks, group ranks, each node's own agent store at 127.0.0.1, or with
  --torch_store=rank0 one MASTER_ADDR:MASTER_PORT that is not the rendezvous port; one round).
- Elastic mode: 3 agents x 2 workers with --rdzv_backend=c10d (the alias) against one endpoint
  train the same script with world size 6, and --nnodes=2:3 with 2 agents and a short last call
  forms a round of 2 without waiting for a third.
- The agent that hosts the rendezvous raises its open-file limit to the hard limit; its workers
  keep the limit they were started with.

Why equal weights are expected: ddp_train.py splits one global batch evenly over the ranks and DDP
averages gradients, so every step is the full-batch step whatever the world size (see the script).
A launcher that gave two workers the same RANK, a wrong WORLD_SIZE or two masters would move the
weights far beyond ATOL (or hang, which the bounded waits turn into a failure).
"""

import os
import time

import multinode_lib as ml
from ddprun_testlib import main

ATOL = 1e-5
# World sizes 1, 2, 4 and 6 all divide the global batch of 48; 192 samples = 4 steps per epoch.
TRAIN_ARGS = ["--epochs", "3", "--samples", "192", "--global_batch", "48", "--seed", "7"]
TRAIN_TIMEOUT_S = 75


class MultiNodeTest(ml.MultiNodeTestCase):

    def wait_for(self, predicate, timeout, what, jobs):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.fail("timed out waiting for %s\n%s" % (what, self.describe_all(jobs)))
            time.sleep(0.05)

    def train_summary(self, out, jobs, world):
        summary = ml.read_json(out + ".json")
        self.assertEqual(summary["world_size"], world, self.describe_all(jobs))
        self.assertEqual(summary["restart_count"], "0", self.describe_all(jobs))
        initial, final = summary["initial_weights"], summary["final_weights"]
        moved = max(abs(a - b) for a, b in zip(initial, final))
        self.assertGreater(moved, 100 * ATOL, "training did not change the weights")
        self.assertLess(summary["losses"][-1], summary["losses"][0], "loss did not fall")
        return summary

    _reference = None  # computed once per run of this script

    def reference(self):
        """The same training as one node with 4 workers (--standalone)."""
        if MultiNodeTest._reference is None:
            MultiNodeTest._reference = self.run_reference()
        return MultiNodeTest._reference

    def run_reference(self):
        out = self.path("standalone.pt")
        job = self.agent("ref", ["--standalone", "--nproc_per_node=4", ml.DDP_TRAIN, "--out", out] + TRAIN_ARGS)
        res = job.wait(TRAIN_TIMEOUT_S)
        self.assert_exit(res, 0)
        return self.train_summary(out, [job], 4)

    def assert_weights_close(self, got, expected, what):
        self.assertEqual(len(got), len(expected), what)
        diff = max(abs(a - b) for a, b in zip(got, expected))
        self.assertLessEqual(diff, ATOL, "%s: max |difference| %.3g exceeds %.0e" % (what, diff, ATOL))

    def static_args(self, node_rank, port, nproc=2):
        return ["--nnodes=2", "--node_rank=%d" % node_rank, "--master_addr=127.0.0.1", "--master_port=%d" % port,
                "--nproc_per_node=%d" % nproc, "--shutdown_timeout=2"]

    def test_static_two_nodes_ddp_matches_standalone(self):
        expected = self.reference()
        port = ml.free_port()
        out = self.path("static.pt")
        prog = [ml.DDP_TRAIN, "--out", out] + TRAIN_ARGS
        # Node 1 first: it must wait for node 0's rendezvous rather than fail.
        jobs = [self.agent("n1", self.static_args(1, port) + prog)]
        jobs.insert(0, self.agent("n0", self.static_args(0, port) + prog))
        results = self.wait_all(jobs, TRAIN_TIMEOUT_S)
        for res in results:
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)
        got = self.train_summary(out, jobs, 4)
        self.assertIn("saved", results[0].stdout, "rank 0 (node 0) did not save\n" + self.describe_all(jobs))
        self.assertNotIn("saved", results[1].stdout, "a rank on node 1 saved too\n" + self.describe_all(jobs))
        self.assertEqual(got["initial_weights"], expected["initial_weights"])
        self.assert_weights_close(got["final_weights"], expected["final_weights"], "static 2x2 vs standalone 4")
        for a, b in zip(got["losses"], expected["losses"]):
            self.assertAlmostEqual(a, b, delta=ATOL)

    def static_environment(self, extra):
        port = ml.free_port()
        prog = self.recorder()
        self.release()  # record and exit at once
        jobs = [self.agent("n%d" % r, self.static_args(r, port) + extra + [prog]) for r in (1, 0)]
        for res in self.wait_all(jobs, 30):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)
        recs = self.records()
        self.assertEqual(len(recs), 4, recs)
        for r in recs:
            node_rank = int(r["node"][1:])
            self.assertEqual(r["rank"], 2 * node_rank + r["local_rank"], r)
            self.assertEqual((r["world"], r["group_rank"], r["group_world"], r["restart"]), (4, node_rank, 2, 0), r)
        self.assertEqual({r["master_addr"] for r in recs}, {"127.0.0.1"}, recs)
        self.assertNotIn(port, {r["master_port"] for r in recs}, "MASTER_PORT is the rendezvous port")
        self.assertEqual(len({r["round"] for r in recs}), 1, recs)
        return recs

    def test_static_environment_across_nodes(self):
        # Each node's agent serves torch's store on its own loopback: a port per node.
        recs = self.static_environment([])
        for node in ("n0", "n1"):
            ports = {r["master_port"] for r in recs if r["node"] == node}
            self.assertEqual(len(ports), 1, "ranks of node %s disagree on MASTER_PORT: %s" % (node, recs))

    def test_static_environment_across_nodes_with_rank0s_store(self):
        recs = self.static_environment(["--torch_store=rank0"])
        self.assertEqual(len({r["master_port"] for r in recs}), 1, "nodes disagree on MASTER_PORT: %s" % recs)

    def test_hosting_agent_raises_its_file_limit_not_its_workers(self):
        # Node 0 hosts the server, which holds a descriptor per agent and per store client: it takes
        # the hard open-file limit. Its workers keep the limit they were started with (a raised soft
        # limit would break programs that use select()).
        port = ml.free_port()
        prog = self.script("limits.sh", 'ulimit -Sn > "%s/limit_${NODE_TAG}_${LOCAL_RANK}"\n'
                                         'while [ ! -e "%s" ]; do sleep 0.05; done\n' % (self.tmp, self.path("release")))
        limit = ["prlimit", "--nofile=256:8192", "--"]
        jobs = [self.agent("n%d" % r, self.static_args(r, port) + [prog], prefix=limit) for r in (1, 0)]
        self.wait_for(lambda: len([f for f in os.listdir(self.tmp) if f.startswith("limit_")]) == 4, 30,
                      "the 4 workers' limits", jobs)
        node0 = jobs[1]
        self.assertEqual(ml.open_file_limits(node0.pid), (8192, 8192), self.describe_all(jobs))
        self.assertEqual(ml.open_file_limits(jobs[0].pid), (256, 8192), "node 1 hosts nothing")
        for name in sorted(f for f in os.listdir(self.tmp) if f.startswith("limit_")):
            with open(os.path.join(self.tmp, name)) as f:
                self.assertEqual(f.read().strip(), "256", "worker %s" % name)
        self.release()
        for res in self.wait_all(jobs, 30):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)

    def test_elastic_three_nodes_c10d_alias_ddp(self):
        expected = self.reference()
        port = ml.free_port()
        out = self.path("elastic.pt")
        prog = [ml.DDP_TRAIN, "--out", out] + TRAIN_ARGS
        # All three at once: exactly one of them can host the endpoint, the others join it.
        jobs = [self.agent("e%d" % i, self.elastic_args(3, port, nproc=2, backend="c10d") + prog) for i in range(3)]
        results = self.wait_all(jobs, TRAIN_TIMEOUT_S)
        for res in results:
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)
        got = self.train_summary(out, jobs, 6)
        self.assertEqual(sum("saved" in r.stdout for r in results), 1,
                         "not exactly one rank 0\n" + self.describe_all(jobs))
        self.assert_weights_close(got["final_weights"], expected["final_weights"], "elastic 3x2 vs standalone 4")

    def test_elastic_min_max_short_last_call_forms_round_of_two(self):
        port = ml.free_port()
        prog = self.recorder()
        self.release()
        conf = "last_call_timeout=0.5"
        jobs = [self.agent(t, self.elastic_args("2:3", port, nproc=2, conf=conf) + [prog]) for t in ("a", "b")]
        results = self.wait_all(jobs, 25)  # the default last call (30 s) would not fit
        for res in results:
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)
        recs = self.records()
        self.assertEqual(len(recs), 4, recs)
        self.assertEqual(sorted(r["rank"] for r in recs), [0, 1, 2, 3], recs)
        self.assertEqual({(r["world"], r["group_world"], r["restart"]) for r in recs}, {(4, 2, 0)}, recs)
        self.assertEqual(len({r["round"] for r in recs}), 1, recs)
        for tag in ("a", "b"):
            mine = [r for r in recs if r["node"] == tag]
            self.assertEqual(len({r["group_rank"] for r in mine}), 1, recs)
            self.assertEqual(sorted(r["rank"] - r["local_rank"] for r in mine), [2 * mine[0]["group_rank"]] * 2, recs)


if __name__ == "__main__":
    main()
