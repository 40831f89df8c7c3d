"""--legacy_local_rank: scripts written for `python -m torch.distributed.launch` read their local
rank from argv, not the environment. ddprun passes `--local_rank=N` (underscore) or
`--local-rank=N` (dash) right after the script, before its own arguments, as that launcher did;
the environment contract stays. The script below parses argv with argparse exactly as the old
tutorials do, and fails on anything it does not know."""

import os
import sys

from ddprun_testlib import DdprunTestCase, main

SCRIPT = r"""
import argparse, os, sys
p = argparse.ArgumentParser()
p.add_argument("--%(flag)s", type=int, required=True)
p.add_argument("--epochs", type=int, required=True)
a = p.parse_args()
rank = getattr(a, "local_rank")
with open(os.path.join(%(d)r, "seen_%%d" %% rank), "w") as f:
    f.write("%%d %%s %%d %%s\n" %% (rank, os.environ["LOCAL_RANK"], a.epochs, " ".join(sys.argv[1:])))
"""


class LegacyLocalRankTest(DdprunTestCase):

    def run_script(self, mode, flag):
        script = self.write_file("old_launch_%s.py" % mode, SCRIPT % {"flag": flag, "d": self.tmp})
        env = dict(os.environ, PYTHON_EXEC=sys.executable)
        res = self.run_job(["--standalone", "--nproc_per_node=3", "--legacy_local_rank=" + mode, script,
                            "--epochs", "7"], env=env)
        self.assert_exit(res, 0)
        for lr in range(3):
            rank, env_rank, epochs, argv = self.read("seen_%d" % lr).strip().split(" ", 3)
            self.assertEqual((rank, env_rank, epochs), (str(lr), str(lr), "7"), res.describe())
            self.assertEqual(argv, "--%s=%d --epochs 7" % (flag, lr), "not placed where launch put it")

    def test_underscore(self):
        self.run_script("underscore", "local_rank")

    def test_dash(self):
        self.run_script("dash", "local-rank")

    def test_without_it_such_a_script_fails(self):
        # The reason for the flag: the script requires --local_rank, which nothing passes by default.
        script = self.write_file("old_launch.py", SCRIPT % {"flag": "local_rank", "d": self.tmp})
        res = self.run_job(["--standalone", "--nproc_per_node=1", script, "--epochs", "7"],
                           env=dict(os.environ, PYTHON_EXEC=sys.executable))
        self.assert_exit(res, 2)  # argparse's usage error
        self.assertIn("--local_rank", res.stderr, res.describe())


if __name__ == "__main__":
    main()
