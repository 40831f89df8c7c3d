"""ddprun under a real two-node Slurm, the nodes made of network namespaces (needs root).

Hosts (test_netns.TestHosts, 192.0.2.0/24): n1 and n2 run a slurmd each (`slurmd -N nX`, NodeAddr
its address), ct runs slurmctld; one munged serves all (its socket is a file). Each daemon, and
srun, runs in its host's network namespace entered with nsenter (ip netns exec would remount /sys
and hide the cgroup tree slurmd reads) and in a mount namespace of its own whose /etc/hosts names
the hosts and maps this machine's host name to the host's own address: the namespaces share one
UTS name, and gloo finds the address it listens on through it.

  - `srun -N2 --ntasks-per-node=1 ddprun prog`: one ddprun per node, no flags; the two form one
    job (ranks 0-3, two workers a node), rank 0 on the step's first node, MASTER_ADDR its name;
  - `srun -N2 --ntasks-per-node=1 ddprun examples/torch/ddp_train.py` (no ddprun flag: one worker
    per node, no GPUs here) trains across the two hosts, world size 2.
Skipped, with the reason, where the Slurm packages are missing or this is not root.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

import ddprun_testlib as tl
from ddprun_testlib import main
from netns_lib import make_test_hosts

import slurm_cluster  # noqa: E402

DDP_TRAIN = os.path.join(tl.REPO, "examples", "torch", "ddp_train.py")
RUN_S = 180  # safety bound for one srun; a run takes seconds here

RECORD = r"""
import json, os, sys
keys = ("RANK LOCAL_RANK WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE MASTER_ADDR TORCHELASTIC_RUN_ID SLURMD_NODENAME "
        "DDPRUN_STORE_ADDR").split()
with open(os.path.join(sys.argv[1], "rank_%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
"""


class SlurmNetnsTest(unittest.TestCase):

    def setUp(self):
        problem = slurm_cluster.missing()
        if problem:
            self.skipTest("no Slurm cluster here: " + problem)
        if os.geteuid() != 0:
            self.skipTest("network namespaces need root")
        self.hosts = make_test_hosts(self, ["n1", "n2", "ct"])
        self.work = tempfile.mkdtemp(prefix="ddprun_slurm_netns_")
        os.chmod(self.work, 0o755)
        self.addCleanup(shutil.rmtree, self.work, True)
        me = socket.gethostname().split(".")[0]
        self.prefix = {}
        for tag in ("n1", "n2", "ct"):
            hosts = os.path.join(self.work, "hosts_" + tag)
            with open(hosts, "w") as f:
                f.write("127.0.0.1 localhost\n")
                for other in ("n1", "n2", "ct"):
                    f.write("%s %s\n" % (self.hosts.addr[other], other))
                f.write("%s %s\n" % (self.hosts.addr[tag], me))
            self.prefix[tag] = ["nsenter", "--net=/var/run/netns/" + self.hosts.ns[tag], "unshare", "-m",
                                "--propagation", "private", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
                                hosts]
        self.cluster = slurm_cluster.SlurmCluster(
            nodes=[("n1", self.hosts.addr["n1"], self.prefix["n1"]), ("n2", self.hosts.addr["n2"], self.prefix["n2"])],
            controller=(self.hosts.addr["ct"], self.prefix["ct"]))
        self.addCleanup(self.cluster.stop)  # runs before the namespaces go
        self.cluster.start()

    def srun(self, argv):
        env = {k: v for k, v in self.cluster.env().items() if not k.startswith("PET_")}
        env["PYTHON_EXEC"] = tl.PYTHON_EXEC
        cmd = self.prefix["n1"] + ["srun", "-N2", "--ntasks-per-node=1"] + argv
        p = subprocess.run(cmd, env=env, cwd=self.work, capture_output=True, text=True, timeout=RUN_S)
        self.describe = "%s\nexit %d\n--- stdout ---\n%s\n--- stderr ---\n%s\n--- slurmctld.log ---\n%s" % (
            " ".join(argv), p.returncode, p.stdout[-3000:], p.stderr[-3000:], self.cluster.log("slurmctld.log")[-1500:])
        return p

    def test_two_nodes_form_one_job_with_no_flags(self):
        prog = os.path.join(self.work, "record.py")
        with open(prog, "w") as f:
            f.write(RECORD)
        p = self.srun([tl.DDPRUN, "--nproc_per_node=2", prog, self.work])
        self.assertEqual(p.returncode, 0, self.describe)
        ranks = {}
        for r in range(4):
            with open(os.path.join(self.work, "rank_%d.json" % r)) as f:
                ranks[r] = json.load(f)
        self.assertEqual({d["WORLD_SIZE"] for d in ranks.values()}, {"4"}, self.describe)
        self.assertEqual({d["GROUP_WORLD_SIZE"] for d in ranks.values()}, {"2"}, self.describe)
        # The rendezvous and the job's store on the step's first node, by the name Slurm gives it (it
        # resolves here; where it does not, ddprun takes its NodeAddr: test_slurm_cluster.py);
        # torch's store is each node's agent, on loopback.
        self.assertEqual({d["DDPRUN_STORE_ADDR"].rsplit(":", 1)[0] for d in ranks.values()}, {"n1"}, ranks)
        self.assertEqual({d["MASTER_ADDR"] for d in ranks.values()}, {"127.0.0.1"}, ranks)
        self.assertEqual([ranks[r]["SLURMD_NODENAME"] for r in range(4)], ["n1", "n1", "n2", "n2"], ranks)
        self.assertEqual(len({d["TORCHELASTIC_RUN_ID"] for d in ranks.values()}), 1, ranks)
        self.assertTrue(ranks[0]["TORCHELASTIC_RUN_ID"].startswith("slurm-"), ranks)

    def test_torch_ddp_trains_across_the_two_hosts(self):
        out = os.path.join(self.work, "model.pt")
        p = self.srun([tl.DDPRUN, DDP_TRAIN, "--out", out, "--epochs", "2"])  # no ddprun flag: one worker a node
        self.assertEqual(p.returncode, 0, self.describe)
        with open(out + ".json") as f:
            summary = json.load(f)
        self.assertEqual(summary["world_size"], 2, summary)


if __name__ == "__main__":
    main()
