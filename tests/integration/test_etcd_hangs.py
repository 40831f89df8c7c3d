"""--rdzv_backend=etcd and the hang rules that cross nodes (README "When a job hangs"): a rank that
finished on one node starts --finish_timeout on the other (RankFinished -> PeerFinished through the
driver's notices in etcd), so seed 001 split over two nodes ends with 124 on both, with the waiting
rank's Python stack. A real 3-member etcd cluster per test (etcd_testlib); torch 1.13 workers."""

import os
import re

import unittest_main
from etcd_testlib import EtcdTestBase
from hang_workers import UNEVEN

PYTHON = os.environ.get("PYTHON_EXEC") or "/usr/bin/python3"  # Debian's torch 1.13, or the torch 2.x tier's


class EtcdHangsTest(EtcdTestBase):
    def test_a_rank_that_finished_on_another_node_starts_the_bound(self):
        prog = self.write_file("uneven.py", UNEVEN)
        jobs = [self.agent(t, "2", [PYTHON, prog, "1"], env={"PET_FINISH_TIMEOUT": "3"}) for t in ("a", "b")]
        results = self.wait_all(jobs, 120)
        described = "\n".join(r.describe() for r in results)
        self.assertEqual([r.returncode for r in results], [124, 124], described)
        waiting = [r for r in results if "wait_for_peer_that_left" in r.stderr]
        self.assertEqual(len(waiting), 1, described)
        self.assertTrue(re.search(r"finished: .*rank 1\b", waiting[0].stderr), described)
        self.assertRegex(waiting[0].stderr, r"still running: rank 0\b", described)


if __name__ == "__main__":
    unittest_main.main()
