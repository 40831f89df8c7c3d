"""The daemon's limits, and what it says when it holds to them.

The daemon's descriptor cap holds under a connection flood with the connection guard on (three
descriptors per connection: the client's socket and the relay's pair), and the flood costs a few
log lines, not one per connection. The daemon runs with an open-file limit of 256 (prlimit), so
its cap is 256 - 128 (the reserve) = 128 descriptors; 400 clients connect as fast as they can and
send the HTTP/2 preface. Before: the pending connections' pairs came after the cap's count, and
the daemon reached all 256 descriptors.

A refused client hears why: an agent refused at the daemon's connection cap says so within
seconds (it used to say nothing until "cannot reach the rendezvous" at its connect timeout), and
a connection cut for a flood of control frames gets a GOAWAY naming the limit (it used to see only
"Socket closed").
"""

import os
import shutil
import signal
import socket
import struct
import threading
import time

import multinode_lib as ml
from ddprun_testlib import main

LIMIT = 256
RESERVE = 128  # RendezvousServerOptions::reserveFds
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")  # + empty SETTINGS


class FdCapTest(ml.MultiNodeTestCase):
    def test_the_cap_holds_with_the_guard_under_a_flood_and_the_log_stays_short(self):
        if not shutil.which("prlimit"):
            self.skipTest("prlimit (util-linux) is not installed")
        port = ml.free_port()
        daemon = ml.Daemon(self, port, prefix=["prlimit", "--nofile=%d:%d" % (LIMIT, LIMIT)],
                           extra=["--connection_guard", "on"])
        peak = [0]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], len(os.listdir("/proc/%d/fd" % daemon.pid)))
                except OSError:
                    pass
                time.sleep(0.001)

        sampler = threading.Thread(target=sample)
        sampler.start()
        socks = []
        try:
            for _ in range(400):
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)
                    s.sendall(PREFACE)
                    socks.append(s)
                except OSError:
                    pass  # refused at the cap: closed at once
            time.sleep(1.5)
        finally:
            stop.set()
            sampler.join()
            for s in socks:
                s.close()
        log = daemon.stdout() + daemon.stderr()
        # The cap; +2 for a descriptor in passing (the renumbering dup, the /proc read itself).
        self.assertLessEqual(peak[0], LIMIT - RESERVE + 2, "descriptors past the cap\n" + log[-3000:])
        self.assertLessEqual(log.count("refusing connections"), 2, log[-3000:])
        self.assertLessEqual(log.count("accept failed"), 2, log[-3000:])
        self.assertIn("3 per connection", log)
        # The flood is gone: a job runs on the same daemon.
        time.sleep(0.5)
        job = self.agent("a", self.elastic_args(1, port) + ["--no_python", "/bin/true"])
        res = job.wait(ml.SAFETY_TIMEOUT_S)
        self.assertEqual(res.returncode, 0, res.describe() + "\n" + log[-3000:])

    def test_an_agent_refused_at_the_connection_cap_says_so(self):
        port = ml.free_port()
        ml.Daemon(self, port, extra=["--max_connections", "1"])
        hold = socket.create_connection(("127.0.0.1", port))  # the one connection it keeps
        hold.sendall(PREFACE)
        self.addCleanup(hold.close)
        time.sleep(0.3)
        job = self.agent("a", self.elastic_args(2, port, conf="is_host=0,join_timeout=600")
                         + ["--no_python", "/bin/true"])
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while "connection limit" not in job.stderr():
            self.assertIsNone(job.poll(), job.result(job.poll()).describe())
            self.assertLess(time.monotonic(), deadline,
                            "the agent never said it was refused\n" + job.result(None).describe())
            time.sleep(0.1)
        self.assertIn("refused the connection: ddprun-rdzv is at its connection limit", job.stderr())
        job.kill(signal.SIGTERM)
        self.assertEqual(job.wait(ml.SAFETY_TIMEOUT_S).returncode, 128 + signal.SIGTERM)

    def test_a_connection_cut_for_a_ping_flood_is_told_why(self):
        port = ml.free_port()
        ml.Daemon(self, port)  # the guard is on by default
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.addCleanup(s.close)
        s.sendall(PREFACE)
        time.sleep(0.3)  # gRPC's SETTINGS has come through the relay
        ping = struct.pack(">I", 8)[1:] + bytes([0x6, 0]) + struct.pack(">I", 0) + b"12345678"
        try:
            s.sendall(ping * 6000)  # past the 5000 control frames a connection may send at once
        except OSError:
            pass
        received = b""
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            received += chunk
        self.assertIn(b"ddprun-rdzv closed the connection: it sent control frames", received,
                      "no GOAWAY naming the limit in %d bytes" % len(received))


if __name__ == "__main__":
    main()
