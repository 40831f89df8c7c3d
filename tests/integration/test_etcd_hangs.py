"""--rdzv_backend=etcd and the hang rules that cross nodes (README "When a job hangs"): a rank that
finished on one node starts --finish_timeout on the other (RankFinished -> PeerFinished through the
driver's notices in etcd), so seed 001 split over two nodes ends with 124 on both, with the waiting
rank's Python stack. A real 3-member etcd cluster per test (etcd_testlib); torch 1.13 workers."""

import re

import unittest_main
from etcd_testlib import EtcdTestBase

PYTHON = "/usr/bin/python3"

# Seed 001 on CPU (as test_finish_timeout.py): rank 1 leaves, rank 0 waits for a key it never sets.
UNEVEN = r'''
import datetime, os, sys
import torch.distributed as dist

def wait_for_peer_that_left(store):
    store.wait(["rank1_batch_100"], datetime.timedelta(seconds=600))

rank = int(os.environ["RANK"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      int(os.environ["WORLD_SIZE"]), rank == 0, datetime.timedelta(seconds=60))
store.set("rank%d_ready" % rank, "1")
store.wait(["rank0_ready", "rank1_ready"])
if rank == 1:
    sys.exit(0)
wait_for_peer_that_left(store)
'''


class EtcdHangsTest(EtcdTestBase):
    def test_a_rank_that_finished_on_another_node_starts_the_bound(self):
        prog = self.write_file("uneven.py", UNEVEN)
        jobs = [self.agent(t, "2", [PYTHON, prog], env={"PET_FINISH_TIMEOUT": "3"}) for t in ("a", "b")]
        results = self.wait_all(jobs, 120)
        described = "\n".join(r.describe() for r in results)
        self.assertEqual([r.returncode for r in results], [124, 124], described)
        waiting = [r for r in results if "wait_for_peer_that_left" in r.stderr]
        self.assertEqual(len(waiting), 1, described)
        self.assertTrue(re.search(r"finished: .*rank 1\b", waiting[0].stderr), described)
        self.assertRegex(waiting[0].stderr, r"still running: rank 0\b", described)


if __name__ == "__main__":
    unittest_main.main()
