"""ddprun as a Slurm step's entrypoint (README: Slurm), with Slurm's environment faked.

`srun --ntasks-per-node=1 ddprun train.py` gives ddprun nothing but the step's environment; these
tests set that environment by hand (variables only, no Slurm) and run the built ddprun:
  - --dry_run in node 1 of a 3-node step shows the derived node count, node rank, rendezvous
    host and port, run id and workers per node, one `node <rank>: <host>` line per node, and the
    workers' ranks that follow from them;
  - flags given win; --no_slurm and PET_NO_SLURM take nothing from the step;
  - contradicting flags, a batch script (no step, or the batch step) and several tasks per node
    are exit 2 with one line, the last two with the exact srun line to run instead;
  - real runs: node 0 of a one-node step, and both nodes of a two-node step side by side on this
    machine, train examples/torch/ddp_train.py with as many workers per node as
    SLURM_GPUS_ON_NODE says (gloo on CPU, so no GPU is needed).
A real Slurm cluster is tests/integration/test_slurm_cluster.py.
"""

import os
import random
import re
import socket
import threading

import e2e_lib
from e2e_lib import DDP_TRAIN, E2ETestCase, read_json

JOB, STEP, RESTARTS = 4242, 1, 1
PORT = 10000 + (JOB + STEP) % 20000  # README's formula: 14243
RUN_ID = "slurm-%d.%d.r%d" % (JOB, STEP, RESTARTS)
# The first host must resolve (the rendezvous host is checked before anything starts).
NODELIST, HOSTS = "localhost,gpu[008-009]", ["localhost", "gpu008", "gpu009"]


def step_env(nodes, node_id, nodelist, job=JOB, step=STEP, restarts=RESTARTS, **extra):
    """What srun --ntasks-per-node=1 puts in the environment of the task on node `node_id`."""
    env = dict(SLURM_JOB_ID=str(job), SLURM_JOBID=str(job), SLURM_STEP_ID=str(step), SLURM_STEPID=str(step),
               SLURM_JOB_NUM_NODES=str(nodes), SLURM_NNODES=str(nodes), SLURM_STEP_NUM_NODES=str(nodes),
               SLURM_JOB_NODELIST=nodelist, SLURM_NODELIST=nodelist, SLURM_STEP_NODELIST=nodelist,
               SLURM_NODEID=str(node_id), SLURM_PROCID=str(node_id), SLURM_LOCALID="0",
               SLURM_NTASKS=str(nodes), SLURM_NPROCS=str(nodes), SLURM_STEP_NUM_TASKS=str(nodes),
               SLURM_NTASKS_PER_NODE="1", SLURM_TASKS_PER_NODE="1(x%d)" % nodes,
               SLURM_STEP_TASKS_PER_NODE="1(x%d)" % nodes, SLURM_RESTART_COUNT=str(restarts))
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def free_port_in_slurm_range():
    """A port of 10000-29999 that nothing listens on now (the kernel's free ports lie above)."""
    for _ in range(1000):
        port = random.randrange(10000, 30000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 10000-29999 after 1000 tries")


class SlurmEntrypointTest(E2ETestCase):

    def dry_run(self, flags=(), **slurm):
        env = self.base_env(**step_env(3, 1, NODELIST, SLURM_GPUS_ON_NODE="2", **slurm))
        return self.ddprun(["--dry_run"] + list(flags), DDP_TRAIN, env=env)

    def assertUsageError(self, result, *mentions):
        self.assertEqual(result.returncode, 2, result.describe())
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.describe())
        for text in mentions:
            self.assertIn(text, lines[0])
        self.assertNotIn("dry run", result.stdout)

    def test_dry_run_takes_everything_from_the_step(self):
        result = self.dry_run()
        self.assertSucceeded(result)
        out = result.stdout
        self.assertIn("ddprun dry run: 2 worker(s) on this node, run id %s\n" % RUN_ID, out)
        self.assertIn("rendezvous: static at localhost:%d, 3..3 nodes\n" % PORT, out)
        self.assertIn("slurm: job %d step %d (restart %d), this is node 1 of 3\n" % (JOB, STEP, RESTARTS), out)
        nodes = re.findall(r"^node (\d+): (\S+)$", out, re.M)
        self.assertEqual(nodes, [(str(i), h) for i, h in enumerate(HOSTS)], out)
        # Node 1 of 3 with 2 workers each: ranks 2 and 3 of 6.
        self.assertIn("  0 -> 2\n  1 -> 3\n", out)
        for var in ("RANK=2", "RANK=3", "WORLD_SIZE=6", "GROUP_RANK=1", "GROUP_WORLD_SIZE=3",
                    "LOCAL_WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=" + RUN_ID):
            self.assertRegex(out, r"(?m)^  %s$" % re.escape(var))

    def test_flags_given_win(self):
        result = self.dry_run(["--nproc_per_node=1", "--master_port=29555", "--rdzv_id=mine", "--nnodes=3",
                               "--node_rank=1"])
        self.assertSucceeded(result)
        self.assertIn("1 worker(s) on this node, run id mine\n", result.stdout)
        self.assertIn("rendezvous: static at localhost:29555, 3..3 nodes\n", result.stdout)
        # PET_* variables are given flags too.
        env = self.base_env(**step_env(3, 1, NODELIST, PET_MASTER_PORT="29556", PET_NPROC_PER_NODE="3"))
        result = self.ddprun(["--dry_run"], DDP_TRAIN, env=env)
        self.assertSucceeded(result)
        self.assertIn("3 worker(s) on this node, run id %s\n" % RUN_ID, result.stdout)
        self.assertIn("static at localhost:29556", result.stdout)

    def test_no_slurm_takes_nothing(self):
        for flags, extra in ((["--no_slurm"], {}), ([], {"PET_NO_SLURM": "1"})):
            env = self.base_env(**step_env(3, 1, NODELIST, SLURM_GPUS_ON_NODE="2", **extra))
            result = self.ddprun(["--dry_run"] + flags, DDP_TRAIN, env=env)
            self.assertSucceeded(result)
            self.assertIn("ddprun dry run: 1 worker(s) on this node, run id none\n", result.stdout)
            self.assertNotIn("node 0:", result.stdout)
            self.assertNotIn("rendezvous:", result.stdout)
            # Not the step's port: the agent's own free one (torch's store, --torch_store).
            self.assertRegex(result.stdout, r"(?m)^  MASTER_PORT=<a free port, chosen at start>$")

    def test_contradicting_flags_exit_2(self):
        self.assertUsageError(self.dry_run(["--nnodes=4"]), "--nnodes 4 contradicts the Slurm step, which has 3 node(s)")
        self.assertUsageError(self.dry_run(["--node_rank=0"]),
                              "--node_rank 0 contradicts the Slurm step, which runs this ddprun as node 1")

    def test_batch_script_gets_the_srun_line(self):
        srun = "`srun --nodes=3 --ntasks=3 --ntasks-per-node=1 %s --dry_run %s`" % (e2e_lib.DDPRUN, DDP_TRAIN)
        # sbatch's script: the job's variables, no step.
        batch = dict(SLURM_STEP_ID=None, SLURM_STEPID=None, SLURM_STEP_NUM_NODES=None, SLURM_STEP_NODELIST=None,
                     SLURM_STEP_NUM_TASKS=None, SLURM_STEP_TASKS_PER_NODE=None, SLURM_NTASKS_PER_NODE="8")
        self.assertUsageError(self.dry_run(**batch), "outside srun (no SLURM_STEP_ID)", srun, "--no_slurm")
        batch.update(SLURM_STEP_ID="batch")
        self.assertUsageError(self.dry_run(**batch), "(SLURM_STEP_ID=batch, not an srun step)", srun)

    def test_several_tasks_per_node_get_the_srun_line(self):
        srun = "`srun --nodes=3 --ntasks=3 --ntasks-per-node=1 %s --dry_run %s`" % (e2e_lib.DDPRUN, DDP_TRAIN)
        result = self.dry_run(SLURM_STEP_TASKS_PER_NODE="2(x3)", SLURM_STEP_NUM_TASKS="6")
        self.assertUsageError(result, "several ddprun tasks per node (SLURM_STEP_TASKS_PER_NODE=2(x3))", srun)

    def test_one_node_step_trains(self):
        # A job id whose port is free now (the port formula's inverse), so the run cannot collide.
        port = free_port_in_slurm_range()
        job = port - 10000 + 20000
        out = os.path.join(self.tmp, "model.pt")
        env = self.base_env(**step_env(1, 0, os.uname().nodename.split(".")[0], job=job, step=0, restarts=0,
                                       SLURM_GPUS_ON_NODE="2"))
        dry = self.ddprun(["--dry_run"], DDP_TRAIN, env=env)
        self.assertSucceeded(dry)
        self.assertRegex(dry.stdout, r"(?m)^  MASTER_PORT=%d$" % port)
        self.assertRegex(dry.stdout, r"(?m)^  MASTER_ADDR=127\.0\.0\.1$")
        self.assertRegex(dry.stdout, r"(?m)^  TORCHELASTIC_RUN_ID=slurm-%d\.0\.r0$" % job)

        result = self.ddprun([], DDP_TRAIN, ["--out", out, "--epochs", "2"], env=env)
        self.assertSucceeded(result)
        summary = read_json(out + ".json")
        self.assertEqual(summary["world_size"], 2)  # SLURM_GPUS_ON_NODE
        self.assertEqual(len(summary["losses"]), 2)

    def test_two_node_step_trains(self):
        # Both nodes of a 2-node step on this machine: node 0 hosts the rendezvous at the first
        # host of the list and the step's port, node 1 joins it; nothing but Slurm's variables.
        port = free_port_in_slurm_range()
        job = port - 10000 + 20000
        out = os.path.join(self.tmp, "model.pt")
        results = {}

        def node(node_id):
            env = self.base_env(**step_env(2, node_id, "localhost,127.0.0.1", job=job, step=0, restarts=0,
                                           SLURM_GPUS_ON_NODE="2"))
            results[node_id] = self.ddprun([], DDP_TRAIN, ["--out", out, "--epochs", "2"], env=env)

        nodes = [threading.Thread(target=node, args=(i,)) for i in (0, 1)]
        for t in nodes:
            t.start()
        for t in nodes:
            t.join()
        for node_id in (0, 1):
            self.assertSucceeded(results[node_id])
        summary = read_json(out + ".json")
        self.assertEqual(summary["world_size"], 4)  # 2 nodes x SLURM_GPUS_ON_NODE
        self.assertEqual(len(summary["losses"]), 2)


if __name__ == "__main__":
    e2e_lib.main()
