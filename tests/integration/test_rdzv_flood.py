"""A connection flood must not wedge the rendezvous daemon.

ddprun-rdzv runs with an open-file limit of 256; 400 idle TCP connections exceed it. gRPC 1.51's
own listener stopped accepting for good after accept() failed with EMFILE: once the flood ended,
no job could rendezvous again. ddprun's listener caps connections below the limit (closing the
excess at once), recovers from EMFILE with backoff, and closes connections that send nothing.
After the flood a new job rendezvouses and finishes.
"""

import socket
import time

import multinode_lib as ml
from ddprun_testlib import main

FLOOD = 400
JOB_S = 30  # safety bound: a wedged daemon never answers


class RendezvousFloodTest(ml.MultiNodeTestCase):

    def test_a_job_runs_after_a_connection_flood(self):
        port = ml.free_port()
        daemon = ml.Daemon(self, port, prefix=["prlimit", "--nofile=256:256"], log_level="warning")
        socks = []
        try:
            for _ in range(FLOOD):
                try:
                    socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                except OSError:
                    break  # the backlog is full: the flood is as big as it gets
            self.assertGreater(len(socks), 256, "the flood did not exceed the daemon's open-file limit")
            time.sleep(1)
        finally:
            for s in socks:
                s.close()
        self.assertIsNone(daemon.poll(), "the daemon died in the flood\n%s" % daemon.result(daemon.poll()).describe())
        job = self.agent("a", self.elastic_args(1, port, nproc=1, conf="is_host=0") + ["--no_python", "/bin/true"])
        self.assert_exit(job.wait(JOB_S), 0)
        self.assertIn("refusing connections", daemon.stderr(), "the cap was never reached")


if __name__ == "__main__":
    main()
