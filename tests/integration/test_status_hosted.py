"""`ddprun-rdzv status` against an agent that hosts its job's rendezvous (torchrun's c10d habit:
node 0 serves the endpoint), with the job's token: the job, its node and the server's name; a
missing token is refused with exit 2. README "ddprun-rdzv status"."""
import json
import os
import subprocess
import time
import uuid

import multinode_lib as ml
from ddprun_testlib import main


class HostedStatusTest(ml.MultiNodeTestCase):

    def status(self, port, *args, token=None):
        env = {k: v for k, v in os.environ.items() if k != "DDPRUN_RDZV_TOKEN"}
        if token:
            env["DDPRUN_RDZV_TOKEN"] = token
        return subprocess.run([ml.RDZV, "status", "--rdzv_endpoint", "127.0.0.1:%d" % port] + list(args), env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=ml.SAFETY_TIMEOUT_S)

    def test_status_of_an_agent_hosted_rendezvous(self):
        token = "tok-" + uuid.uuid4().hex
        token_path = self.write_file("token", token + "\n")
        port = ml.free_port()
        release = self.path("release")
        prog = self.write_file("worker.sh", "#!/bin/sh\nn=0\nwhile [ ! -e %s ] && [ $n -lt 600 ]; do sleep 0.1; "
                               "n=$((n+1)); done\n" % release, executable=True)
        job = self.agent("a", self.elastic_args(1, port, conf="is_host=1,token_file=" + token_path) + [prog])
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while True:
            r = self.status(port, "--json", token=token)
            if r.returncode == 0 and json.loads(r.stdout)["jobs"] and json.loads(r.stdout)["jobs"][0]["phase"] == "running":
                break
            if job.poll() is not None:
                self.fail("the agent exited:\n%s" % job.result(job.poll()).describe())
            self.assertLess(time.monotonic(), deadline, "status never showed the running job: %s %s" % (r.stdout, r.stderr))
            time.sleep(0.1)
        reply = json.loads(r.stdout)
        self.assertTrue(reply["server"].startswith("agent-hosted"), reply)
        (j,) = reply["jobs"]
        self.assertEqual((j["round"], j["node_count"], j["agents_connected"], j["last_failure"]), (1, 1, 1, None), j)
        self.assertEqual(j["nodes"][0]["group_rank"], 0)
        self.assertEqual(j["nodes"][0]["state"], "running")
        self.assertGreaterEqual(j["nodes"][0]["last_heartbeat_age_ms"], 0)
        refused = self.status(port)
        self.assertEqual(refused.returncode, 2, refused.stderr)
        self.assertIn("invalid job token", refused.stderr)
        with open(release, "w"):
            pass
        self.assert_exit(job.wait(ml.SAFETY_TIMEOUT_S), 0)


if __name__ == "__main__":
    main()
