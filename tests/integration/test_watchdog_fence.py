"""ddprun-watchdog's fence (docs/rendezvous.md, "Fencing"), driven over its lifeline pipe as the agent
drives it: "+PGID" tracks a worker group, "fNS" says that the group must be dead at CLOCK_MONOTONIC
time NS unless a later deadline comes first. The watchdog kills at the deadline even though the
"agent" (this test) says nothing more, keeps watching afterwards, and a deadline that is moved on
in time kills nothing."""

import os
import signal
import subprocess
import time

from ddprun_testlib import BIN_DIR, DdprunTestCase, main

WATCHDOG = os.path.join(BIN_DIR, "ddprun-watchdog")


class WatchdogFenceTest(DdprunTestCase):

    def setUp(self):
        super().setUp()
        read_end, self.pipe = os.pipe()
        # The lifeline is the watchdog's fd 3, as the agent starts it.
        move = "" if read_end == 3 else "3<&%d %d<&-" % (read_end, read_end)
        self.watchdog = subprocess.Popen(["sh", "-c", 'exec "$0" --marker "$1" ' + move,
                                          WATCHDOG, "DDPRUN_JOB_fencetest%d" % os.getpid()],
                                         pass_fds=(read_end,), stdin=subprocess.DEVNULL)
        os.close(read_end)
        self.addCleanup(self.stop_watchdog)

    def stop_watchdog(self):
        try:
            os.close(self.pipe)
        except OSError:
            pass
        try:
            self.watchdog.wait(10)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()
            self.watchdog.wait()

    def send(self, line):
        os.write(self.pipe, (line + "\n").encode())

    def worker(self):
        """A process group of its own, as the agent makes one per worker."""
        p = subprocess.Popen(["sleep", "60"], start_new_session=True)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait()))
        self.send("+%d" % p.pid)
        return p

    @staticmethod
    def at(seconds_from_now):
        return "f%d" % int((time.monotonic() + seconds_from_now) * 1e9)

    def test_kills_the_workers_at_the_deadline_and_keeps_watching(self):
        w = self.worker()
        started = time.monotonic()
        self.send(self.at(0.3))
        self.assertEqual(w.wait(10), -signal.SIGKILL)
        took = time.monotonic() - started
        self.assertGreaterEqual(took, 0.25, "killed before the deadline")
        self.assertIsNone(self.watchdog.poll(), "the watchdog must keep watching after a fence")
        # A group started after the fence is not killed without a new deadline ...
        w2 = self.worker()
        time.sleep(0.5)
        self.assertIsNone(w2.poll(), "a fence fired twice")
        # ... and the lifeline's end still kills it (the watchdog's first job).
        os.close(self.pipe)
        self.assertEqual(w2.wait(10), -signal.SIGKILL)
        self.assertEqual(self.watchdog.wait(10), 0)

    def test_a_later_deadline_replaces_the_earlier_one(self):
        w = self.worker()
        self.send(self.at(0.4))
        for _ in range(8):  # the agent hears from the server every 0.2 s and moves the deadline on
            time.sleep(0.2)
            self.send(self.at(0.4))
        self.assertIsNone(w.poll(), "a worker was fenced although the deadline kept moving")
        self.send("-%d" % w.pid)
        self.send("bye")
        self.assertEqual(self.watchdog.wait(10), 0)
        self.assertIsNone(w.poll(), "'bye' means the agent cleaned up: the watchdog kills nothing")

    def test_a_deadline_in_the_past_kills_at_once(self):
        w = self.worker()
        self.send("f1")
        self.assertEqual(w.wait(10), -signal.SIGKILL)


if __name__ == "__main__":
    main()
