"""torch's store served by ddprun's agent (agent/torch_store.h), with real torch (PYTHON_EXEC: Debian's
1.13, or the torch 2.x tier's) and init_process_group("gloo") through env://, as users write it:

- a DDP job on one node and on two (static backend: each agent forwards to the job's store on the
  rendezvous server), its workers told TORCHELASTIC_USE_AGENT_STORE=True and 127.0.0.1;
- rank 0 leaving while the others go on using the store (they keep it: under --torch_store=rank0,
  the case that fails, the store died with rank 0);
- the others waiting in store.wait() after rank 0 left: torch's own timeout error within their
  timeout, never a hang nor a reset;
- a process that is not one of the job's (this test, with torch's TCPStore client, and a job that
  has a token) is refused, and the job goes on;
- --master_port is honoured; --torch_store=rank0 keeps torchrun's rank-0 store;
- libddp's C++ ranks and torch's ranks of one job share one store, on two nodes (the job's store)
  and on one (the agent's, through torch's protocol).
"""

import datetime
import json
import os
import subprocess
import sys
import time
import unittest

import ddprun_testlib as tl
import multinode_lib as ml
from ddprun_testlib import PYTHON_EXEC, main

JOB = tl.worker("torch_store_job.py")
TIMEOUT = 120  # safety only: each job imports torch on 2 cores


class TorchStoreTest(ml.MultiNodeTestCase):
    def out_dir(self, name):
        d = self.path(name)
        os.makedirs(d, exist_ok=True)
        return d

    def ranks(self, out, world):
        got = {}
        for r in range(world):
            p = os.path.join(out, "rank%d.json" % r)
            if os.path.exists(p):
                with open(p) as f:
                    got[r] = json.load(f)
        return got

    def run_single(self, mode, nproc=3, flags=(), env=None):
        out = self.out_dir(mode)
        res = self.run_job(["--nproc_per_node=%d" % nproc, "--max_restarts=0"] + list(flags) + [JOB, mode, out],
                           env=env, timeout=TIMEOUT)
        return res, self.ranks(out, nproc)

    def test_ddp_on_one_node_through_the_agents_store(self):
        res, got = self.run_single("ddp")
        self.assert_exit(res, 0)
        self.assertEqual(sorted(got), [0, 1, 2], res.describe())
        for r, seen in got.items():
            self.assertEqual(seen["TORCHELASTIC_USE_AGENT_STORE"], "True", seen)
            self.assertEqual(seen["MASTER_ADDR"], "127.0.0.1", seen)
            self.assertTrue(seen["agree"], "parameters differ across ranks: %s" % seen)
        self.assertEqual(len({s["MASTER_PORT"] for s in got.values()}), 1)

    def test_master_port_is_honoured(self):
        port = ml.free_port()
        res, got = self.run_single("ddp", nproc=2, flags=["--master_port=%d" % port])
        self.assert_exit(res, 0)
        self.assertEqual({s["MASTER_PORT"] for s in got.values()}, {str(port)}, res.describe())

    def test_rank0_leaving_takes_no_store_with_it(self):
        res, got = self.run_single("rank0_leaves")
        self.assert_exit(res, 0)
        self.assertEqual(sorted(got), [0, 1, 2], res.describe())
        self.assertTrue(got[0]["left"])
        for r in (1, 2):
            self.assertTrue(got[r]["kept"], got[r])
        self.assertEqual(sorted(got[r]["added"] for r in (1, 2)), [1, 2])

    def test_rank0_store_mode_still_loses_the_store_with_rank0(self):
        # The old mode, kept behind --torch_store=rank0: the same job cannot go on without rank 0.
        res, got = self.run_single("rank0_leaves", flags=["--torch_store=rank0"])
        self.assertNotEqual(res.returncode, 0, res.describe())
        self.assertTrue(all(not got.get(r, {}).get("kept") for r in (1, 2)), got)
        self.assertIn("False", {s.get("TORCHELASTIC_USE_AGENT_STORE") for s in got.values()} | {"False"})

    def test_waiting_after_rank0_left_times_out_cleanly(self):
        res, got = self.run_single("wait_missing")
        self.assert_exit(res, 0)
        for r in (1, 2):
            self.assertIn(r, got, res.describe())
            err = got[r]["error"]
            self.assertIsNotNone(err, "the wait for a key nobody sets returned")
            self.assertIn("timeout", err.lower(), err)  # torch's timeout, not a reset connection
            self.assertLess(got[r]["waited"], 30, got[r])  # its own 3 s timeout, with room for a slow machine

    def test_rank0_killed_while_the_others_wait_ends_the_job_at_once(self):
        # A restart policy's view (no restarts): the job ends with rank 0's SIGKILL long before the
        # others' 600 s wait, which neither hangs nor outlives the job.
        res, got = self.run_single("rank0_killed")
        self.assertEqual(res.returncode, 128 + 9, res.describe())
        self.assertLess(res.elapsed, 120, res.describe())
        self.assertTrue(got.get(0, {}).get("killed"), got)
        self.assertTrue(all(got.get(r, {}).get("waiting") for r in (1, 2)), got)

    def stranger_is_refused(self, job_env=None, extra_flags=()):
        out = self.out_dir("stranger")
        job = self.start(["--nproc_per_node=2", "--max_restarts=0"] + list(extra_flags) + [JOB, "stranger", out],
                         env=job_env)
        self.wait_for_files(["stranger/address"], timeout=TIMEOUT, job=job)
        with open(os.path.join(out, "address")) as f:
            host, port = f.read().split()
        probe = (
            "import datetime, sys, torch.distributed as dist\n"
            "try:\n"
            "    s = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, wait_for_workers=False,\n"
            "                      timeout=datetime.timedelta(seconds=5))\n"
            "    s.set('stranger', 'x')\n"
            "    print(s.get('stranger'))\n"
            "except Exception as e:\n"
            "    print('refused:', type(e).__name__, e)\n"
            "    sys.exit(3)\n")
        p = subprocess.run([PYTHON_EXEC, "-c", probe, host, port], capture_output=True, text=True, timeout=60)
        with open(os.path.join(out, "go"), "w"):
            pass
        res = job.wait(TIMEOUT)
        self.assert_no_survivors(job, res)
        self.assertEqual(p.returncode, 3, "a process outside the job used the store:\n%s\n%s" % (p.stdout, p.stderr))
        self.assert_exit(res, 0)
        self.assertIn("refused a connection", res.stderr)
        self.assertEqual(sorted(self.ranks(out, 2)), [0, 1])

    def test_a_process_outside_the_job_is_refused(self):
        self.stranger_is_refused()

    def test_two_nodes_with_a_token_forward_to_the_jobs_store(self):
        # Static, two agents on loopback, a job token: each agent's torch store forwards to the
        # rendezvous server's store with the token; the DDP job spans both.
        token = self.path("token")
        with open(token, "w") as f:
            f.write("s3cret-torch-store\n")
        os.chmod(token, 0o600)
        port = ml.free_port()
        out = self.out_dir("two")
        args = lambda r: ["--nnodes=2", "--node_rank=%d" % r, "--master_addr=127.0.0.1", "--master_port=%d" % port,
                          "--nproc_per_node=2", "--max_restarts=0", "--shutdown_timeout=2",
                          "--rdzv_conf=token_file=" + token, JOB, "ddp", out]
        jobs = [self.agent("n0", args(0)), self.agent("n1", args(1))]
        results = self.wait_all(jobs, TIMEOUT)
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe_all(jobs))
        got = self.ranks(out, 4)
        self.assertEqual(sorted(got), [0, 1, 2, 3], self.describe_all(jobs))
        for seen in got.values():
            self.assertEqual((seen["TORCHELASTIC_USE_AGENT_STORE"], seen["MASTER_ADDR"]), ("True", "127.0.0.1"))
            self.assertTrue(seen["agree"], seen)
        self.assert_no_leftovers(jobs)

    def test_cpp_and_torch_ranks_of_one_job_share_the_store(self):
        # Two static nodes of two ranks: odd ranks libddp's C++ client (DDPRUN_STORE_ADDR, the
        # framing), even ranks torch's TCPStore client through their agent. One store: every
        # rank counts all four arrivals and sees one leader.
        port = ml.free_port()
        test_bin = os.environ.get("DDPRUN_TEST_BIN") or os.path.join(tl.REPO, "build", "test-bin")
        args = lambda r: ["--nnodes=2", "--node_rank=%d" % r, "--master_addr=127.0.0.1", "--master_port=%d" % port,
                          "--nproc_per_node=2", "--max_restarts=0", "--shutdown_timeout=2",
                          tl.worker("mixed_store_job.py")]
        env = {"DDPRUN_TEST_BIN": test_bin}
        jobs = [self.agent("n0", args(0), env=env), self.agent("n1", args(1), env=env)]
        results = self.wait_all(jobs, TIMEOUT)
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe_all(jobs))
        lines = [l for r in results for l in r.stdout.splitlines() if "arrived=" in l]
        self.assertEqual(len(lines), 4, self.describe_all(jobs))
        self.assertTrue(all("arrived=4 " in l for l in lines), lines)
        leaders = {l.rsplit("leader=", 1)[1].strip() for l in lines}
        self.assertEqual(len(leaders), 1, lines)
        self.assert_no_leftovers(jobs)

    def test_cpp_and_torch_ranks_on_one_node_share_the_agents_store(self):
        # One node: libddp's ranks reach the agent's store through torch's protocol
        # (DDPRUN_STORE_ADDR=tcpstore://, worker_sdk/tcp_store.h), not a folder of their own.
        test_bin = os.environ.get("DDPRUN_TEST_BIN") or os.path.join(tl.REPO, "build", "test-bin")
        res = self.run_job(["--standalone", "--nproc_per_node=4", "--max_restarts=0", tl.worker("mixed_store_job.py")],
                           env={"DDPRUN_TEST_BIN": test_bin}, timeout=TIMEOUT)
        self.assert_exit(res, 0)
        lines = [l for l in res.stdout.splitlines() if "arrived=" in l]
        self.assertEqual(len(lines), 4, res.describe())
        self.assertTrue(all("arrived=4 " in l for l in lines), lines)
        leaders = {l.rsplit("leader=", 1)[1].strip() for l in lines}
        self.assertEqual(len(leaders), 1, lines)


if __name__ == "__main__":
    main()
