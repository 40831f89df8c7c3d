"""scripts/etcd_cluster.py, the fixture every etcd test stands on: a 3-member cluster becomes
healthy, elects one leader, elects another after the leader is killed (and after it is frozen),
and leaves no process or folder behind."""
import os
import sys
import unittest

from etcd_cluster import EtcdCluster, etcd_available  # noqa: E402
import unittest_main  # noqa: E402


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not alive: the fixture reaps its members.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


class EtcdClusterTest(unittest.TestCase):
    def setUp(self):
        reason = etcd_available()
        if reason:
            self.skipTest(reason)

    def test_leader_killed_then_frozen_and_cleanup(self):
        with EtcdCluster(size=3) as c:
            self.assertEqual(len(set(c.client_ports + c.peer_ports)), 6)
            first = c.leader()
            c.kill(first)  # a minority lost: the other two elect a leader
            second = c.leader()
            self.assertNotEqual(first, second)
            pids, folder = [p.pid for p in c.procs], c.dir
        self.assertFalse(os.path.exists(folder))
        self.assertEqual([p for p in pids if _pid_alive(p)], [])

    def test_frozen_leader_is_replaced_and_thaws(self):
        with EtcdCluster(size=3) as c:
            first = c.leader()
            c.stop(first)
            second = c.leader()
            self.assertNotEqual(first, second)
            c.cont(first)
            c.wait_healthy()
            self.assertIn(c.leader(), range(3))  # the thawed member rejoins: all three agree on one leader


if __name__ == "__main__":
    unittest_main.main()
