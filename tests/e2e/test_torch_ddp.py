"""An unmodified PyTorch DDP script (examples/torch/ddp_train.py) trains under ddprun with 1, 2
and 4 workers and under torchrun with 2, and every run ends with the same weights.

Why equal weights are expected: the script splits one global batch of 64 samples evenly over the
ranks and DDP averages the gradients, so each step is the full-batch step whatever the world size
(see the script's docstring). Only the float summation order differs, so weights agree to within
ATOL = 1e-5 (observed differences are around 1e-7). The same training done here in-process, with
no launcher and no process group, is the reference: a launcher that gave two workers the same
RANK, the wrong WORLD_SIZE or a mismatched sampler shard would move the weights far beyond ATOL.
"""

import os
import re
import sys

import e2e_lib
from e2e_lib import DDP_TRAIN, E2ETestCase, read_json

ATOL = 1e-5
EPOCHS = 6

import ddp_train  # noqa: E402  (the example script, imported for the in-process reference)
import torch  # noqa: E402


def reference_training(epochs):
    """Single process, no torch.distributed: SGD on each full global batch, in order."""
    args = ddp_train.parse_args(["--out", "unused", "--epochs", str(epochs)])
    dataset = ddp_train.make_dataset(args.samples, args.seed)
    model = ddp_train.make_model(args.seed + 1)
    initial = ddp_train.flat_weights(model).clone()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.MSELoss()
    x_all, y_all = dataset.tensors
    for _ in range(epochs):
        for start in range(0, args.samples, args.global_batch):
            x, y = x_all[start:start + args.global_batch], y_all[start:start + args.global_batch]
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
    return initial, ddp_train.flat_weights(model)


class TorchDdpTest(E2ETestCase):

    def train(self, launcher, nproc):
        out = os.path.join(self.tmp, "%s_%d.pt" % (launcher, nproc))
        run = self.ddprun if launcher == "ddprun" else self.torchrun
        extra = ["--monitor_interval", "0.1"] if launcher == "torchrun" else []
        result = run(["--standalone", "--nproc_per_node=%d" % nproc] + extra, DDP_TRAIN,
                     ["--out", out, "--epochs", str(EPOCHS)])
        self.assertSucceeded(result)
        summary = read_json(out + ".json")
        self.assertEqual(summary["world_size"], nproc)
        self.assertEqual(summary["restart_count"], "0")

        # Rank 0 printed one loss line per epoch, with the values it saved.
        printed = [(int(e), float(l)) for e, l in re.findall(r"epoch (\d+) loss ([0-9.]+)", result.stdout)]
        self.assertEqual([e for e, _ in printed], list(range(EPOCHS)), result.describe())
        for (_, shown), saved in zip(printed, summary["losses"]):
            self.assertAlmostEqual(shown, saved, places=5)

        # The saved state_dict holds exactly the weights the JSON reports.
        state = torch.load(out)
        flat = torch.cat([state[k].reshape(-1) for k in ("0.weight", "0.bias", "2.weight", "2.bias")])
        self.assertTrue(torch.equal(flat, torch.tensor(summary["final_weights"], dtype=torch.float32)))
        return summary

    def assertWeightsClose(self, a, b, what):
        a, b = torch.tensor(a), torch.tensor(b)
        self.assertEqual(a.shape, b.shape, what)
        diff = (a - b).abs().max().item()
        self.assertLessEqual(diff, ATOL, "%s: max |difference| %.3g exceeds %.0e" % (what, diff, ATOL))

    def test_same_weights_for_any_world_size_and_launcher(self):
        initial, expected = reference_training(EPOCHS)
        runs = {("ddprun", n): self.train("ddprun", n) for n in (1, 2, 4)}
        runs[("torchrun", 2)] = self.train("torchrun", 2)

        for (launcher, n), summary in runs.items():
            what = "%s with %d worker(s)" % (launcher, n)
            with self.subTest(what):
                self.assertTrue(torch.equal(torch.tensor(summary["initial_weights"]), initial.double()), what)
                # Training happened: weights moved well beyond the tolerance, and the loss fell.
                moved = (torch.tensor(summary["final_weights"]) - initial.double()).abs().max().item()
                self.assertGreater(moved, 100 * ATOL, what + ": weights did not change")
                self.assertLess(summary["losses"][-1], 0.5 * summary["losses"][0], what + ": loss did not fall")
                self.assertWeightsClose(summary["final_weights"], expected.tolist(),
                                        what + " vs in-process reference")

        base = runs[("ddprun", 1)]
        for n in (2, 4):
            self.assertWeightsClose(runs[("ddprun", n)]["final_weights"], base["final_weights"],
                                    "ddprun world %d vs world 1" % n)
            for a, b in zip(runs[("ddprun", n)]["losses"], base["losses"]):
                self.assertAlmostEqual(a, b, delta=ATOL)
        self.assertWeightsClose(runs[("ddprun", 2)]["final_weights"], runs[("torchrun", 2)]["final_weights"],
                                "ddprun world 2 vs torchrun world 2")


if __name__ == "__main__":
    e2e_lib.main()
