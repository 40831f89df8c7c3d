"""What the etcd backend's end-to-end tests share (tests/integration/test_etcd_*.py): a fresh real
3-member etcd 3.4 cluster per test (scripts/etcd_cluster.py), real ddprun agents on it as users
run them, and the record every worker writes of its start. docs/etcd.md."""
import os
import time
import uuid

import ddprun_testlib as tl
import multinode_lib as ml
from etcd_cluster import EtcdCluster, etcd_available

TEST_BIN = os.environ.get("DDPRUN_TEST_BIN") or os.path.join(tl.REPO, "build", "test-bin")
STORE_EXCHANGE = os.path.join(TEST_BIN, "store_exchange")
PREFIX = "/ddprun-test"

# Records one line per worker start, then waits for the test's release file (or exits at once).
RECORD = r"""#!/bin/sh
echo "$NODE_TAG $DDPRUN_ROUND $RANK $WORLD_SIZE $GROUP_RANK $TORCHELASTIC_RESTART_COUNT" >> "%(d)s/rec_$$"
while [ ! -e "%(d)s/release" ]; do sleep 0.05; done
exit "${EXIT_CODE:-0}"
"""


class EtcdTestBase(tl.DdprunTestCase):
    """A fresh cluster per test, and agents of this test's job on it."""
    TLS = False

    def setUp(self):
        super().setUp()
        reason = etcd_available()
        if reason:
            self.skipTest(reason)
        self.cluster = EtcdCluster(size=3, tls=self.TLS)
        self.cluster.start()
        self.addCleanup(self.cluster.close)
        self.run_id = "etcd_%s" % uuid.uuid4().hex[:8]

    def agent(self, tag, nnodes, program, nproc=1, backend="etcd", conf="heartbeat_timeout=2", env=None):
        args = ["--nnodes=%s" % nnodes, "--nproc_per_node=%d" % nproc, "--rdzv_backend=%s" % backend,
                "--rdzv_endpoint=%s" % ",".join(self.cluster.endpoints), "--rdzv_id=%s" % self.run_id,
                "--local_addr=127.0.0.1", "--shutdown_timeout=2",
                "--rdzv_conf=%s,etcd_prefix=%s" % (conf, PREFIX), "--no_python"] + list(program)
        e = ml.clean_env({"NODE_TAG": tag})
        e.update(env or {})
        return ml.Proc(self, [tl.DDPRUN] + args, env=e, name="agent_" + tag)

    def wait_all(self, jobs, timeout=ml.SAFETY_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        return [j.wait(max(0.1, deadline - time.monotonic())) for j in jobs]

    def records(self):
        out = []
        for name in os.listdir(self.tmp):
            if name.startswith("rec_"):
                with open(self.path(name)) as f:
                    out += [line.split() for line in f if len(line.split()) == 6]
        return out

    def wait_records(self, predicate, jobs, what):
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while not predicate(self.records()):
            for j in jobs:
                if j.poll() is not None:
                    self.fail("an agent exited (%s) while waiting for %s\n%s" % (j.poll(), what, j.result(j.poll()).describe()))
            if time.monotonic() > deadline:
                self.fail("no %s within the safety bound; records %s\n%s" % (
                    what, self.records(), "\n".join(j.result(j.poll()).describe() for j in jobs)))
            time.sleep(0.02)

    def recorder(self):
        return [self.script("record.sh", RECORD % {"d": self.tmp})]

    def assert_job_keys_gone(self):
        self.assertEqual(self.cluster.keys(PREFIX + "/"), [], "the job left keys in etcd")


# Fails with exit 3 on node a while TORCHELASTIC_RESTART_COUNT is below FAIL_UNTIL; records every
# start (node, restart count) first.
FLAKY = r"""#!/bin/sh
echo "$NODE_TAG $TORCHELASTIC_RESTART_COUNT" >> "%(d)s/starts"
if [ "$NODE_TAG" = a ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt %(fail_until)d ]; then exit 3; fi
while [ ! -e "%(d)s/release" ]; do sleep 0.05; done
"""
