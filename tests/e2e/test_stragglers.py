"""Stragglers: a rank whose own work per step is well above the others' is reported by rank (a
warning naming it, its median step time and the group's), and no other rank is. The step's
compute time comes from libddp's GradientReducer (examples/train passes it to its Heartbeat; a
rank slowed by a test hook), and from ddprun.report_step(step, seconds) in Python."""

import os
import re

import e2e_lib as el

TRAIN = os.path.join(el.BIN_DIR, "train")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PYTHON_WORKER = r'''
import os, time
import ddprun
rank = int(os.environ["RANK"])
# The ranks of a data-parallel job step together: each runs for the same 2.5 s (beats are thinned
# to one per 100 ms, each carrying the mean of its steps), rank 1 with 8x the others' work.
end = time.monotonic() + 2.5
step = 0
while time.monotonic() < end:
    work = 0.04 if rank == 1 else 0.005
    time.sleep(work)
    step += 1
    ddprun.report_step(step, seconds=work)
'''

STRAGGLER_RE = re.compile(r"straggler: rank (\d+) takes ([0-9.]+)s of its own work per step")


class StragglerTest(el.E2ETestCase):
    def stragglers(self, res):
        return sorted({int(m.group(1)) for m in STRAGGLER_RE.finditer(res.stderr)})

    def test_sdk_a_slow_rank_is_reported_by_rank_and_no_other(self):
        self.assertTrue(os.access(TRAIN, os.X_OK), "train not built at %s" % TRAIN)
        res = self.ddprun(["--standalone", "--nproc_per_node=3"], TRAIN,
                          ["--epochs", "2", "--samples", "1536", "--batch", "48", "--slow_rank", "2", "--slow_ms", "30"],
                          env=self.base_env())
        self.assertSucceeded(res)
        self.assertEqual(self.stragglers(res), [2], res.describe())
        seconds = float(STRAGGLER_RE.search(res.stderr).group(2))
        self.assertGreaterEqual(seconds, 0.03, res.describe())

    def test_sdk_even_ranks_have_no_straggler(self):
        res = self.ddprun(["--standalone", "--nproc_per_node=3"], TRAIN,
                          ["--epochs", "2", "--samples", "1536", "--batch", "48"], env=self.base_env())
        self.assertSucceeded(res)
        self.assertEqual(self.stragglers(res), [], res.describe())

    def test_python_report_step_seconds(self):
        prog = os.path.join(self.tmp, "w.py")
        with open(prog, "w") as f:
            f.write(PYTHON_WORKER)
        env = self.base_env()
        env["PYTHONPATH"] = os.path.join(REPO, "python")
        res = self.ddprun(["--standalone", "--nproc_per_node=3"], el.PYTHON_EXEC, [prog], env=env)
        self.assertSucceeded(res)
        self.assertEqual(self.stragglers(res), [1], res.describe())


if __name__ == "__main__":
    el.main()
