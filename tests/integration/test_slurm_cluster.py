"""ddprun under a real Slurm (scripts/slurm_cluster.py: munged, slurmctld and slurmd on this
machine, one node, started and removed by the test).

  - `srun -N1 --ntasks-per-node=1 ddprun examples/torch/ddp_train.py` with no ddprun flag trains
    (PYTHON_EXEC=/usr/bin/python3, gloo), and `--dry_run` in the same kind of step shows what
    Slurm gave: this node's name, the job's run id and port (README: Slurm);
  - ddprun in a batch script (no srun) exits 2 with an srun line, and that very line, run in the
    same batch script, works;
  - a step with two tasks on the node exits 2 in both tasks;
  - a first node whose name resolves nowhere but in Slurm is reached at its NodeAddr.
Skipped, with the reason, where the packages are missing or this is not root.
"""

import json
import os
import re
import socket
import subprocess
import sys
import unittest

import ddprun_testlib as tl
from ddprun_testlib import main

import slurm_cluster  # noqa: E402

DDP_TRAIN = os.path.join(tl.REPO, "examples", "torch", "ddp_train.py")
RUN_S = 120  # safety bound for one srun/sbatch; a run takes a few seconds here


class SlurmClusterTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = None
        problem = slurm_cluster.missing()
        if problem:
            raise unittest.SkipTest("no Slurm cluster here: " + problem)
        cls.cluster = slurm_cluster.SlurmCluster()
        cls.cluster.start()

    @classmethod
    def tearDownClass(cls):
        if cls.cluster:
            cls.cluster.stop()

    def setUp(self):
        self.assertTrue(os.access(tl.DDPRUN, os.X_OK), "ddprun not built at %s" % tl.DDPRUN)
        self.work = os.path.join(self.cluster.dir, self.id().rsplit(".", 1)[-1])
        os.makedirs(self.work)

    def run_slurm(self, argv):
        env = self.cluster.env()
        env = {k: v for k, v in env.items() if not k.startswith("PET_")}
        env["PYTHON_EXEC"] = tl.PYTHON_EXEC
        p = subprocess.run(argv, env=env, cwd=self.work, capture_output=True, text=True, timeout=RUN_S)
        self.describe = "%s\nexit %d\n--- stdout ---\n%s\n--- stderr ---\n%s\n--- slurmd.log (tail) ---\n%s" % (
            " ".join(argv), p.returncode, p.stdout[-3000:], p.stderr[-3000:], self.cluster.log("slurmd.log")[-2000:])
        return p

    def test_srun_ddprun_with_no_flags_trains(self):
        dry = self.run_slurm(["srun", "-N1", "--ntasks-per-node=1", tl.DDPRUN, "--dry_run", DDP_TRAIN])
        self.assertEqual(dry.returncode, 0, self.describe)
        job = re.search(r"slurm: job (\d+) step 0 \(restart 0\), this is node 0 of 1", dry.stdout)
        self.assertIsNotNone(job, self.describe)
        job = int(job.group(1))
        self.assertIn("node 0: %s\n" % self.cluster.node_name, dry.stdout)
        self.assertRegex(dry.stdout, r"(?m)^  TORCHELASTIC_RUN_ID=slurm-%d\.0\.r0$" % job)
        self.assertRegex(dry.stdout, r"(?m)^  MASTER_PORT=%d$" % (10000 + job % 20000))

        out = os.path.join(self.work, "model.pt")
        run = self.run_slurm(["srun", "-N1", "--ntasks-per-node=1", tl.DDPRUN, DDP_TRAIN, "--out", out,
                              "--epochs", "2"])
        self.assertEqual(run.returncode, 0, self.describe)
        with open(out + ".json") as f:
            summary = json.load(f)
        self.assertEqual(summary["world_size"], 1)  # no GPU in this cluster: one worker
        self.assertEqual(len(summary["losses"]), 2)

    def test_batch_script_is_told_the_srun_line_and_it_works(self):
        script = os.path.join(self.work, "job.sh")
        out = os.path.join(self.work, "job.out")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n"
                    "%s --dry_run %s 2>advice.txt\n"
                    "echo \"first: $?\"\n"
                    "line=$(sed -n 's/.*`\\(srun [^`]*\\)`.*/\\1/p' advice.txt)\n"
                    "echo \"line: $line\"\n"
                    "eval \"$line\"\n"
                    "echo \"second: $?\"\n" % (tl.DDPRUN, DDP_TRAIN))
        os.chmod(script, 0o755)
        p = self.run_slurm(["sbatch", "--wait", "-N1", "--ntasks-per-node=2", "-o", out, script])
        with open(out, errors="replace") as f:
            text = f.read()
        self.describe += "\n--- job output ---\n" + text
        self.assertEqual(p.returncode, 0, self.describe)
        self.assertIn("first: 2\n", text)
        self.assertIn("line: srun --nodes=1 --ntasks=1 --ntasks-per-node=1 %s --dry_run %s\n" % (tl.DDPRUN, DDP_TRAIN),
                      text)
        self.assertIn("this is node 0 of 1", text)
        self.assertIn("second: 0\n", text)
        with open(os.path.join(self.work, "advice.txt")) as f:
            self.assertIn("outside srun (no SLURM_STEP_ID)", f.read())

    def test_two_tasks_on_a_node_exit_2(self):
        p = self.run_slurm(["srun", "-N1", "--ntasks-per-node=2", tl.DDPRUN, "--dry_run", DDP_TRAIN])
        self.assertNotEqual(p.returncode, 0, self.describe)
        self.assertIn("Exited with exit code 2", p.stderr, self.describe)
        self.assertEqual(p.stderr.count("several ddprun tasks per node (SLURM_STEP_TASKS_PER_NODE=2)"), 2,
                         self.describe)
        self.assertNotIn("dry run", p.stdout)


class SlurmNodeAddrTest(unittest.TestCase):
    """A node whose name resolves nowhere but in Slurm: ddprun takes its NodeAddr (README: Slurm)."""

    NODE = "ddprun-nores-node"

    @classmethod
    def setUpClass(cls):
        cls.cluster = None
        problem = slurm_cluster.missing()
        if problem:
            raise unittest.SkipTest("no Slurm cluster here: " + problem)
        try:
            socket.getaddrinfo(cls.NODE, None)
            raise unittest.SkipTest("%s resolves on this machine; the test needs a name that does not" % cls.NODE)
        except socket.gaierror:
            pass
        cls.cluster = slurm_cluster.SlurmCluster(node_name=cls.NODE)
        cls.cluster.start()

    @classmethod
    def tearDownClass(cls):
        if cls.cluster:
            cls.cluster.stop()

    def dry_run(self, conf):
        # Node 1 of a two-node step whose first node is the cluster's: its rendezvous host.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
        env.update(SLURM_CONF=conf, SLURM_JOB_ID="77", SLURM_STEP_ID="0", SLURM_STEP_NUM_NODES="2",
                   SLURM_STEP_NODELIST="%s,other-node" % self.NODE, SLURM_NODEID="1", PYTHON_EXEC=tl.PYTHON_EXEC)
        return subprocess.run([tl.DDPRUN, "--dry_run", DDP_TRAIN], env=env, capture_output=True, text=True,
                              timeout=RUN_S)

    def test_unresolvable_first_node_is_reached_at_its_node_addr(self):
        p = self.dry_run(self.cluster.conf)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("rendezvous: static at 127.0.0.1:10077, 2..2 nodes\n", p.stdout)
        self.assertIn("node 0: %s\n" % self.NODE, p.stdout)

    def test_without_slurms_answer_the_name_is_an_error(self):
        p = self.dry_run(os.path.join(self.cluster.dir, "no-such.conf"))
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("rendezvous host '%s' does not resolve" % self.NODE, p.stderr)


if __name__ == "__main__":
    main()
