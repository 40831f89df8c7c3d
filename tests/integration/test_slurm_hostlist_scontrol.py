"""Slurm hostlist expansion against Slurm itself, live.

tests/unit/slurm_hostlist_cases.inc records what `scontrol show hostnames EXPR` printed for each
expression, and the unit test checks ddprun's expansion against that record. Here, where
scontrol is installed (Debian's slurm-client; no controller needed, only a slurm.conf, written to
a temporary folder), the record is checked against scontrol itself, and ddprun's answer too
(through `ddprun --dry_run` in a fake step whose SLURM_STEP_NODELIST is the expression: its
`node <rank>: <host>` lines). Skipped, with the reason, without scontrol.
"""

import codecs
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import ddprun_testlib as tl
from ddprun_testlib import main

CASES_FILE = os.path.join(tl.REPO, "tests", "unit", "slurm_hostlist_cases.inc")
_ROW = re.compile(r'^HOSTLIST_CASE\("((?:[^"\\]|\\.)*)", "((?:[^"\\]|\\.)*)"(?:, "((?:[^"\\]|\\.)*)")?\)$')
SCONTROL = shutil.which("scontrol")


def load_cases():
    cases = []
    with open(CASES_FILE) as f:
        for line in f:
            m = _ROW.match(line.strip())
            if m:
                unescape = lambda s: codecs.decode(s, "unicode_escape") if s is not None else None
                cases.append((unescape(m.group(1)), unescape(m.group(2)), unescape(m.group(3))))
    return cases


def summary(hosts):
    """The table's format: hosts joined by a space, or "N hosts: FIRST .. LAST" past 16."""
    if len(hosts) > 16:
        return "%d hosts: %s .. %s" % (len(hosts), hosts[0], hosts[-1])
    return " ".join(hosts)


class ScontrolHostlistTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cases = load_cases()
        cls.tmp = tempfile.mkdtemp(prefix="ddprun_scontrol_")
        cls.conf = os.path.join(cls.tmp, "slurm.conf")
        with open(cls.conf, "w") as f:
            f.write("ClusterName=oracle\nSlurmctldHost=localhost\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, True)

    def requireScontrol(self):
        if not SCONTROL:
            self.skipTest("scontrol is not installed (Debian: apt-get install slurm-client)")

    def scontrol(self, expression):
        env = dict(os.environ, SLURM_CONF=self.conf)
        p = subprocess.run([SCONTROL, "show", "hostnames", expression], capture_output=True, text=True, env=env,
                           timeout=60)
        # scontrol exits 0 even for an invalid list; it says so on stdout or stderr.
        if "Invalid hostlist" in p.stdout + p.stderr or p.returncode != 0:
            return "invalid"
        return summary(p.stdout.split())

    def test_table_is_large_enough(self):
        self.assertGreaterEqual(len([c for c in self.cases if c[2] is None]), 50)

    def test_recorded_answers_are_scontrols(self):
        self.requireScontrol()
        for expression, recorded, _ in self.cases:
            with self.subTest(expression=expression):
                self.assertEqual(self.scontrol(expression), recorded)

    def test_ddprun_dry_run_lists_scontrols_hosts(self):
        self.requireScontrol()
        self.assertTrue(os.access(tl.DDPRUN, os.X_OK), "ddprun not built at %s" % tl.DDPRUN)
        for expression, _, ours in self.cases:
            if ours is not None:
                continue  # a deliberate difference, checked by the unit test
            with self.subTest(expression=expression):
                live = self.scontrol(expression)
                if live == "invalid":
                    nodes = 1
                else:
                    p = subprocess.run([SCONTROL, "show", "hostnames", expression], capture_output=True, text=True,
                                       env=dict(os.environ, SLURM_CONF=self.conf), timeout=60)
                    nodes = len(p.stdout.split())
                if nodes == 0:
                    continue  # no host at all: nothing for a step to name
                env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
                env.update(SLURM_JOB_ID="7", SLURM_STEP_ID="0", SLURM_STEP_NUM_NODES=str(nodes), SLURM_NODEID="0",
                           SLURM_STEP_NODELIST=expression, PYTHON_EXEC=tl.PYTHON_EXEC)
                p = subprocess.run([tl.DDPRUN, "--dry_run", "--master_addr=127.0.0.1", "--no_python", "/bin/true"],
                                   capture_output=True, text=True, env=env, timeout=60)
                if live == "invalid":
                    self.assertEqual(p.returncode, 2, p.stderr)
                    self.assertIn("SLURM_STEP_NODELIST: hostlist", p.stderr)
                    continue
                self.assertEqual(p.returncode, 0, p.stderr)
                lines = re.findall(r"^node (\d+): (.*)$", p.stdout, re.M)
                self.assertEqual([int(rank) for rank, _ in lines], list(range(len(lines))))
                hosts = [host for _, host in lines]
                self.assertEqual(summary(hosts), live)


if __name__ == "__main__":
    main()
