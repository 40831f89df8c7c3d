"""A connection flood must not wedge the rendezvous daemon.

ddprun-rdzv runs with an open-file limit of 256; 400 idle TCP connections exceed it. gRPC 1.51's
own listener stopped accepting for good after accept() failed with EMFILE: once the flood ended,
no job could rendezvous again. ddprun's listener caps connections below the limit (closing the
excess at once), recovers from EMFILE with backoff, and closes connections that send nothing.
After the flood a new job rendezvouses and finishes.

And strangers' idle connections at the cap (issue #37, item 3): with a job token, connections from
another address that send the HTTP/2 preface and SETTINGS, then nothing, fill the cap; a job with
the token still forms while they stay, because at the cap the front door cuts the stranger idle
longest for a newcomer (it was locked out: "at its connection limit" for 31 s, then failed).
"""

import os
import socket
import time
import uuid

import multinode_lib as ml
from ddprun_testlib import main

FLOOD = 400
JOB_S = 30  # safety bound: a wedged daemon never answers
STRANGERS = 200  # idle HTTP/2 connections, more than fit under a 512-descriptor limit (3 each with the guard)
# The client's connection preface and an empty SETTINGS frame: a well-formed, idle HTTP/2 client.
PREFACE_AND_SETTINGS = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


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

    def test_idle_strangers_at_the_cap_do_not_lock_a_job_out(self):
        port = ml.free_port()
        token_path = self.write_file("token", "tok-%s\n" % uuid.uuid4().hex)
        os.chmod(token_path, 0o600)
        daemon = ml.Daemon(self, port, token_file=token_path, prefix=["prlimit", "--nofile=512:512"],
                           log_level="warning")
        strangers = []
        self.addCleanup(lambda: [s.close() for s in strangers])
        for _ in range(STRANGERS):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=("127.0.0.2", 0))
                s.sendall(PREFACE_AND_SETTINGS)
                strangers.append(s)
            except OSError:
                break
        time.sleep(3)  # they are idle now: longer than a client of ours takes to make its first call
        self.assertIn("refusing connections", daemon.stderr(), "the strangers never filled the cap")
        self.run_id = "cap-%s" % uuid.uuid4().hex[:8]
        conf = "is_host=0,token_file=" + token_path
        jobs = [self.agent(t, self.elastic_args(2, port, conf=conf) + ["--no_python", "/bin/true"]) for t in "ab"]
        for res in self.wait_all(jobs, JOB_S):
            self.assert_exit(res, 0)
        self.assertIn("cut a connection idle without the job token", daemon.stderr())
        self.assertIsNone(daemon.poll(), "the daemon died\n%s" % daemon.stderr())


if __name__ == "__main__":
    main()
