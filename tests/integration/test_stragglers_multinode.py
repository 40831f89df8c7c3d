"""Stragglers across nodes: each agent sends its ranks' median step times with its heartbeats to
the one rules host, which compares every rank of the job and tells the agents (JobHealth). Two
real agents on one ddprun-rdzv, each with two ranks of the C++ trainer (gloo over loopback);
rank 3 (node b) is slowed by a test hook: both agents name it, with its node, and no other rank.
Six epochs (about 12 s at 30 ms a step) leave room for the view to form after the local one
(each agent reports every second; the host recomputes at most every second)."""

import os
import re

import multinode_lib as ml
from ddprun_testlib import main

TRAIN = os.path.join(os.path.dirname(ml.RDZV), "train")
JOB_STRAGGLER_RE = re.compile(r"straggler across the job: rank (\d+) on node (\S+) takes")


class StragglersAcrossNodesTest(ml.MultiNodeTestCase):
    def test_a_slow_rank_on_one_node_is_named_on_every_node(self):
        self.assertTrue(os.access(TRAIN, os.X_OK), "train not built at %s" % TRAIN)
        port = ml.free_port()
        ml.Daemon(self, port)
        args = self.elastic_args(2, port, nproc=2) + [TRAIN, "--epochs", "6", "--samples", "2048", "--batch", "32",
                                                      "--slow_rank", "3", "--slow_ms", "30"]
        jobs = [self.agent(t, args) for t in ("a", "b")]
        results = self.wait_all(jobs, 120)
        described = self.describe_all(jobs)
        self.assertEqual([r.returncode for r in results], [0, 0], described)
        for r in results:
            named = {int(m.group(1)) for m in JOB_STRAGGLER_RE.finditer(r.stderr)}
            self.assertEqual(named, {3}, described)
        self.assert_no_leftovers(jobs)


if __name__ == "__main__":
    main()
