"""torch's store on the etcd backend (store/forward/etcd_forwarding.h): each agent serves torch's
TCPStore on 127.0.0.1 for its own workers and runs their requests on the job's keys in a real
3-member etcd cluster, the same keys libddp's workers use there. No node hosts the store, so it
outlives every rank and every node. With real torch (PYTHON_EXEC: Debian's 1.13, or the torch 2.x
tier's) and gloo, two agents of two ranks on loopback:

- a DDP job through env:// (TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR=127.0.0.1): the
  parameters agree on every rank, and the job leaves no key in etcd;
- C++ ranks (libddp's etcd store) and torch ranks (the agents' TCPStore) of one job: one store;
- --recovery=in_process on etcd (exit 2 before this store existed): rank 0 SIGKILLed, its node's
  agent replaces it while the other node's ranks keep their processes and recover in place; the
  final parameters equal those of the same job without a failure.
"""
import json
import os

import ddprun_testlib as tl
import etcd_testlib as et
import recovery_lib
from ddprun_testlib import PYTHON_EXEC, main

JOB = tl.worker("torch_store_job.py")
RECOVERABLE = os.path.join(tl.REPO, "examples", "torch", "recoverable_ddp.py")
TIMEOUT = 240  # safety only: four processes import torch on 2 cores, twice for the recovery


class EtcdTorchStoreTest(et.EtcdTestBase):
    def env(self, extra=None):
        e = {"PYTHONPATH": os.path.join(tl.REPO, "python"), "OMP_NUM_THREADS": "1"}
        e.update(extra or {})
        return e

    def describe(self, results):
        return "\n".join(r.describe() for r in results)

    def test_ddp_on_two_nodes_through_the_agents_store_on_etcd(self):
        out = self.path("ddp")
        os.makedirs(out)
        jobs = [self.agent(t, "2", ["--max_restarts=0", PYTHON_EXEC, JOB, "ddp", out], nproc=2,
                           conf="heartbeat_timeout=5", env=self.env()) for t in "ab"]
        results = self.wait_all(jobs, TIMEOUT)
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe(results))
        got = {}
        for rank in range(4):
            with open(os.path.join(out, "rank%d.json" % rank)) as f:
                got[rank] = json.load(f)
        for seen in got.values():
            self.assertEqual((seen["TORCHELASTIC_USE_AGENT_STORE"], seen["MASTER_ADDR"]), ("True", "127.0.0.1"), seen)
            self.assertTrue(seen["agree"], "parameters differ across ranks: %s" % got)
        self.assert_job_keys_gone()
        for j in jobs:
            self.assertEqual(j.survivors(), [], "workers outlived their agent")

    def test_cpp_and_torch_ranks_of_one_job_share_the_store_on_etcd(self):
        # Odd ranks: libddp's store_exchange on etcd (DDPRUN_STORE_ADDR=etcd://...); even ranks:
        # torch's TCPStore client through their agent. Every rank counts four arrivals and sees one
        # leader only if both kinds reach the same keys.
        jobs = [self.agent(t, "2", ["--max_restarts=0", PYTHON_EXEC, tl.worker("mixed_store_job.py")], nproc=2,
                           conf="heartbeat_timeout=5", env=self.env({"DDPRUN_TEST_BIN": et.TEST_BIN}))
                for t in "ab"]
        results = self.wait_all(jobs, TIMEOUT)
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe(results))
        lines = [l for r in results for l in r.stdout.splitlines() if "arrived=" in l]
        self.assertEqual(len(lines), 4, self.describe(results))
        self.assertTrue(all("arrived=4 " in l for l in lines), lines)
        self.assertEqual(len({l.rsplit("leader=", 1)[1].strip() for l in lines}), 1, lines)
        self.assert_job_keys_gone()

    def recoverable(self, die_at=None, flags=()):
        pids = self.path("pids-%s.txt" % (die_at or "none").replace(":", "-"))
        env = {"RECOVERABLE_PIDS": pids}
        if die_at:
            env["RECOVERABLE_DIE_AT"] = die_at
        program = list(flags) + [PYTHON_EXEC, RECOVERABLE, "--steps", "60", "--step_ms", "0", "--timeout_s", "20",
                                 "--notice_timeout_s", "60"]
        jobs = [self.agent(t, "2", program, nproc=2, conf="heartbeat_timeout=5", env=self.env(env)) for t in "ab"]
        results = self.wait_all(jobs, TIMEOUT)
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe(results))
        digests = [d for d in (recovery_lib.last_digest(r.stdout) for r in results) if d]
        self.assertEqual(len(digests), 1, self.describe(results))
        return results, digests[0], recovery_lib.read_starts(pids)

    def test_rank_0_killed_recovers_in_process_on_etcd(self):
        _, want, _ = self.recoverable(flags=["--max_restarts=0"])
        results, got, starts = self.recoverable("0:25", ["--recovery=in_process", "--max_restarts=2"])
        self.assertEqual(got, want, self.describe(results))
        by_rank = {}
        for rank, pid, _ in starts:
            by_rank.setdefault(rank, []).append(pid)
        self.assertEqual({r: len(p) for r, p in by_rank.items()}, {0: 2, 1: 1, 2: 1, 3: 1},
                         "only rank 0 is a new process: %s" % starts)
        # The node without rank 0 carried all its ranks into the next round.
        self.assertTrue(any("live rank(s) here told round" in r.stderr for r in results), self.describe(results))
        for r in results:
            self.assertNotIn("restarting workers", r.stderr, self.describe(results))
        self.assert_job_keys_gone()


if __name__ == "__main__":
    main()
