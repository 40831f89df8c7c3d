"""scripts/ports.py, which every multi-node test picks its servers' ports with: a port another
test process picked (and may not have bound yet) is not picked again while that process lives
(CI once failed when two tests under ctest -j2 drew the same port)."""

import random
import subprocess
import sys
import unittest
from unittest import mock

import ports
from ddprun_testlib import main

HOLD = """
import sys, ports
sys.stdout.write("%d\\n" % ports.free_port())
sys.stdout.flush()
sys.stdin.read()  # holds the reservation until the test closes stdin
"""


class PortsTest(unittest.TestCase):
    def test_a_port_another_live_process_picked_is_not_picked_again(self):
        holder = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            taken = int(holder.stdout.readline())
            low, high = ports.pick_range()
            self.assertTrue(low <= taken < high, (taken, low, high))
            other = taken + 1 if taken + 1 < high else taken - 1
            # The draw meets the taken port first, as a colliding random pick would.
            draws = iter([taken, other] + [random.randrange(low, high) for _ in range(400)])
            with mock.patch.object(ports.random, "randrange", side_effect=lambda *a: next(draws)):
                picked = ports.free_port()
            self.assertNotEqual(picked, taken)
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
        # Once the holder exits, its reservation is gone with it.
        draws = iter([taken] * 10)
        with mock.patch.object(ports.random, "randrange", side_effect=lambda *a: next(draws)):
            self.assertEqual(ports.free_port(), taken)


if __name__ == "__main__":
    main()
