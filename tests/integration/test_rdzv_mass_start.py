"""A guarded daemon (a job token, the connection guard on: as deployed) takes a simultaneous start
of thousands of agents (issue #24, item 6). Before, every connection was untrusted until its
first call reached gRPC; all untrusted connections shared one budget of 1,000 new streams a second
and at most 256 could wait for it, so a mass start past about 1,300 agents ended with "streams
ended before Join" and nothing in the daemon's log. Now the front door recognizes the job token in
an agent's first request headers (netguard/token_recognizer.h) and no connection is closed for
waiting. The load generator (bench/rdzv_capacity.cc) starts 2,000 agents at once, one connection
each, all from 127.0.0.1 (as through one NAT gateway): every one is assigned its round, none
ends early, and the daemon logged no error. Time limits are safety bounds, not speed claims."""
import json
import os
import subprocess
import uuid

import ddprun_testlib as tl
import multinode_lib as ml
from ddprun_testlib import main

GEN = os.path.join(tl.BIN_DIR, "ddprun-rdzv-capacity")
NODES = 2000


class MassStartTest(ml.MultiNodeTestCase):

    def test_two_thousand_agents_with_the_token_all_join_a_guarded_daemon(self):
        if not os.access(GEN, os.X_OK):
            self.skipTest("ddprun-rdzv-capacity is not built (DDPRUN_BUILD_BENCH=OFF)")
        token_path = self.write_file("token", "tok-%s\n" % uuid.uuid4().hex)
        port = ml.free_port()
        daemon = ml.Daemon(self, port, token_file=token_path, extra=["--connection_guard", "on"])
        cmd = [GEN, "--address", "127.0.0.1:%d" % port, "--daemon_pid", str(daemon.pid), "--jobs", "1", "--nodes",
               str(NODES), "--connect_window", str(NODES), "--heartbeat_timeout_ms", "10000", "--timeout_s", "120",
               "--token_file", token_path]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=ml.SAFETY_TIMEOUT_S + 120,
                             preexec_fn=lambda: __import__("resource").setrlimit(
                                 __import__("resource").RLIMIT_NOFILE, (20000, 20000)))
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        self.assertTrue(lines, "no result from the generator (exit %d): %s" % (out.returncode, out.stderr[-3000:]))
        r = json.loads(lines[-1])
        self.assertEqual(out.returncode, 0, "%s\n%s" % (r, out.stderr[-3000:]))
        self.assertEqual((r["agents"], r["streams_ended"], r["closed_or_rejected"]), (NODES, 0, 0), r)
        self.assertIn("first_join_to_all_assigned_s", r, r)
        log = daemon.stderr()
        self.assertNotIn(" E ", log, "the daemon logged an error:\n%s" % log[-3000:])


if __name__ == "__main__":
    main()
