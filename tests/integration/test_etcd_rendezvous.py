"""--rdzv_backend=etcd end to end, the basics: real ddprun agents on a real 3-member etcd 3.4
cluster, as users run them (etcd_testlib). Faults: test_etcd_faults.py; budgets, scale-up and
whole jobs: test_etcd_jobs.py. docs/etcd.md."""
import json
import os
import re
import subprocess
import time

import multinode_lib as ml
import tls_pki
import unittest_main
from etcd_testlib import PREFIX, STORE_EXCHANGE, EtcdTestBase


class EtcdRendezvousTest(EtcdTestBase):
    def test_two_nodes_form_a_round_and_exit_0(self):
        program = ["/bin/sh", "-c", "echo rank=$RANK world=$WORLD_SIZE round=$DDPRUN_ROUND store=$DDPRUN_STORE_ADDR"]
        jobs = [self.agent(t, "2", program) for t in ("a", "b")]
        results = self.wait_all(jobs)
        for r in results:
            self.assertEqual(r.returncode, 0, r.describe())
            self.assertIn("world=2 round=1 store=etcd://", r.stdout)
        ranks = sorted(int(re.search(r"rank=(\d)", r.stdout).group(1)) for r in results)
        self.assertEqual(ranks, [0, 1])
        self.assert_job_keys_gone()

    def test_etcd_v2_name_and_workers_agree_through_the_store_on_etcd(self):
        if not os.access(STORE_EXCHANGE, os.X_OK):
            self.fail("%s not built (ninja store_exchange)" % STORE_EXCHANGE)
        jobs = [self.agent(t, "2", [STORE_EXCHANGE], nproc=2, backend="etcd-v2") for t in ("a", "b")]
        results = self.wait_all(jobs)
        lines = []
        for r in results:
            self.assertEqual(r.returncode, 0, r.describe())
            lines += re.findall(r"rank (\d): arrived=(\d+) leader=(\d)", r.stdout)
        self.assertEqual(sorted(int(rank) for rank, _, _ in lines), [0, 1, 2, 3])
        self.assertEqual({arrived for _, arrived, _ in lines}, {"4"})  # every add counted once
        self.assertEqual(len({leader for _, _, leader in lines}), 1)    # one compare_set winner for all
        self.assert_job_keys_gone()

    def test_a_job_forms_and_ends_while_an_etcd_member_is_frozen(self):
        # A frozen member accepts connections and answers nothing: agents that start on it move
        # on at their call deadline. Four agents, so that some start there (a random member each).
        follower = [i for i in range(3) if i != self.cluster.leader()][0]
        self.cluster.stop(follower)
        self.addCleanup(lambda: self.cluster.cont(follower))
        program = ["/bin/sh", "-c", "echo rank=$RANK"]
        jobs = [self.agent(t, "4", program) for t in ("a", "b", "c", "d")]
        results = self.wait_all(jobs)
        for r in results:
            self.assertEqual(r.returncode, 0, r.describe())
        ranks = sorted(int(re.search(r"rank=(\d)", r.stdout).group(1)) for r in results)
        self.assertEqual(ranks, [0, 1, 2, 3])
        self.assert_job_keys_gone()

    def test_a_worker_failure_ends_the_job_with_its_exit_code_on_every_node(self):
        jobs = [self.agent("a", "2", self.recorder(), env={"EXIT_CODE": "3"}),
                self.agent("b", "2", self.recorder())]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on both nodes")
        with open(self.path("release"), "w"):
            pass
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 3, r.describe())
        self.assert_job_keys_gone()

    def test_a_node_with_other_rules_is_refused_with_exit_2_naming_the_difference(self):
        first = self.agent("a", "2", self.recorder())
        key = "%s/run/%s/rdzv/driver" % (PREFIX, self.run_id)
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while self.cluster.get(key) is None:  # "a" drives, so the job's rules are its own
            self.assertIsNone(first.poll(), first.result(first.poll()).describe())
            self.assertLess(time.monotonic(), deadline, "no driver within the safety bound")
            time.sleep(0.02)
        other = self.agent("b", "3", self.recorder())
        r = other.wait(ml.SAFETY_TIMEOUT_S)
        self.assertEqual(r.returncode, 2, r.describe())
        self.assertIn("nnodes 3..3 here, 2..2 in the job", r.stderr + r.stdout)
        self.assertIsNone(first.poll(), "the job's own node must not be affected")


    def test_an_agent_with_protocol_https_against_a_plaintext_cluster_is_told_so_with_exit_2(self):
        pki = tls_pki.make_pki(self.path("pki"))
        job = self.agent("a", "1", ["/bin/true"], conf="heartbeat_timeout=2,protocol=https,cacert=%s" % pki["ca"])
        r = job.wait(ml.SAFETY_TIMEOUT_S + 30)
        self.assertEqual(r.returncode, 2, r.describe())
        self.assertIn("the server does not speak TLS", r.stderr + r.stdout)


class EtcdTlsTest(EtcdTestBase):
    """The same backend on a cluster that only speaks TLS with client certificates."""
    TLS = True

    def tls_conf(self):
        c = self.cluster.certs
        return "heartbeat_timeout=2,protocol=https,cacert=%s,cert=%s,key=%s" % (c["ca"], c["client_cert"], c["client_key"])

    def test_two_nodes_over_tls_agree_through_the_store_and_exit_0(self):
        if not os.access(STORE_EXCHANGE, os.X_OK):
            self.fail("%s not built (ninja store_exchange)" % STORE_EXCHANGE)
        jobs = [self.agent(t, "2", [STORE_EXCHANGE], nproc=2, conf=self.tls_conf()) for t in ("a", "b")]
        lines = []
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
            lines += re.findall(r"rank (\d): arrived=(\d+) leader=(\d)", r.stdout)
        self.assertEqual(sorted(int(rank) for rank, _, _ in lines), [0, 1, 2, 3])
        self.assertEqual({arrived for _, arrived, _ in lines}, {"4"})
        self.assert_job_keys_gone()

    def test_status_reads_the_job_over_tls_with_the_same_files(self):
        c = self.cluster.certs
        job = self.agent("a", "2", self.recorder(), conf=self.tls_conf())  # waits for a second node

        def status(*tls):
            cmd = [ml.RDZV, "status", "--rdzv_backend=etcd", "--rdzv_endpoint=%s" % ",".join(self.cluster.endpoints),
                   "--rdzv_prefix=%s" % PREFIX, "--rdzv_id=%s" % self.run_id, "--timeout=5", "--json"] + list(tls)
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while True:
            r = status("--tls_ca", c["ca"], "--tls_cert", c["client_cert"], "--tls_key", c["client_key"])
            if r.returncode == 0 and len(json.loads(r.stdout)["jobs"][0]["nodes"]) == 1:
                break
            self.assertLess(time.monotonic(), deadline, "status over TLS never showed the node: %s %s" % (r.stdout, r.stderr))
            self.assertIsNone(job.poll(), job.result(job.poll()).describe())
            time.sleep(0.1)
        self.assertEqual(json.loads(r.stdout)["jobs"][0]["run_id"], self.run_id)
        # Without the files: one line and a non-zero exit, not a hang.
        plain = status()
        self.assertNotEqual(plain.returncode, 0, plain.stdout)
        self.assertIn("ddprun-rdzv status: error:", plain.stderr)
        self.assertEqual(len(plain.stderr.strip().splitlines()), 1, plain.stderr)
        job.kill()

    def test_a_plaintext_agent_or_one_without_its_certificate_is_told_so_with_exit_2(self):
        # Plain HTTP against a TLS-only cluster, then TLS without the client certificate it asks
        # for: configuration errors (a scheduler must not retry them), each said in one line, after
        # the etcd client's retry budget (5 s at heartbeat_timeout=2), as the gRPC backend says them.
        c = self.cluster.certs
        cases = [("heartbeat_timeout=2", "speaks TLS: give this node --rdzv_conf protocol=https,cacert=CA.pem"),
                 ("heartbeat_timeout=2,protocol=https,cacert=%s" % c["ca"], "the server requires a client certificate")]
        for conf, says in cases:
            with self.subTest(conf=conf):
                job = self.agent("a", "1", ["/bin/true"], conf=conf)
                r = job.wait(ml.SAFETY_TIMEOUT_S + 30)
                self.assertEqual(r.returncode, 2, r.describe())
                self.assertIn(says, r.stderr + r.stdout)
                self.assertIn("etcd at 127.0.0.1:", r.stderr + r.stdout)


if __name__ == "__main__":
    unittest_main.main()
