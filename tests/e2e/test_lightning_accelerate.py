"""Lightning and Accelerate jobs under ddprun, as their users launch them (the torch 2.x tier runs
this file on PyPI's torch, Lightning and Accelerate; Debian's torch 1.13 has neither package, so
there every case reports skipped with that reason).

Lightning: a LightningModule trains with strategy="ddp" on CPUs (gloo) over 2-3 ranks launched by
ddprun, and ddprun's Lightning callback (python/ddprun/lightning.py) reports to the agent:
  - beats per batch: with --hang_timeout shorter than the training, the job still succeeds;
  - step times: a rank whose own work per batch is 10x the others' is named as the straggler;
  - the checkpoint section: a rank stuck in on_save_checkpoint is declared hung in 'checkpoint'.
Accelerate: an Accelerator() training loop (prepare, backward, gather) over 2 ranks: every rank
sees the world ddprun gave it and the same final weights.
"""

import json
import os
import re
import subprocess

import e2e_lib

REPO = e2e_lib.REPO

LIGHTNING_JOB = r'''
import json, os, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import lightning as L
from ddprun.lightning import DdprunCallback

mode, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if mode == "straggler":  # each rank's own work per batch; rank 1 does 10x
            time.sleep(0.05 if self.global_rank == 1 else 0.005)
        elif mode in ("beats", "long_end"):
            time.sleep(0.05)
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def on_train_end(self):
        if mode == "long_end":
            time.sleep(6)  # a final evaluation or upload after the last batch, longer than auto's 3 s floor

    def on_save_checkpoint(self, checkpoint):
        if mode == "stuck_checkpoint" and self.global_rank == 1:
            time.sleep(600)  # as a rank whose checkpoint write waits on a file system that is gone


x = torch.randn(512, 8)
data = TensorDataset(x, x.sum(dim=1, keepdim=True))
batches = {"beats": 8, "long_end": 8, "straggler": 8, "stuck_checkpoint": 32}[mode]
trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=1, strategy="ddp",
                    max_epochs={"beats": 5, "long_end": 1, "straggler": 3, "stuck_checkpoint": 1}[mode],
                    callbacks=[DdprunCallback()], enable_checkpointing=False, logger=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), DataLoader(data, batch_size=batches))
if mode == "stuck_checkpoint":
    trainer.save_checkpoint(os.path.join(out, "model.ckpt"))
weights = [round(v, 6) for v in trainer.lightning_module.layer.weight.detach().flatten().tolist()]
with open(os.path.join(out, "rank_%d.json" % trainer.global_rank), "w") as f:
    json.dump({"world": trainer.world_size, "steps": trainer.global_step, "weights": weights}, f)
'''

ACCELERATE_JOB = r'''
import json, os, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

out = sys.argv[1]
torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(256, 8)
loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
steps = 0
for epoch in range(3):
    for xb, yb in loader:
        optimizer.zero_grad()
        accelerator.backward(nn.functional.mse_loss(model(xb), yb))
        optimizer.step()
        steps += 1
ranks = accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
weights = [round(v, 6) for v in accelerator.unwrap_model(model).weight.detach().flatten().tolist()]
with open(os.path.join(out, "rank_%d.json" % accelerator.process_index), "w") as f:
    json.dump({"type": str(accelerator.distributed_type), "processes": accelerator.num_processes,
               "gathered": ranks, "steps": steps, "weights": weights}, f)
'''

STRAGGLER_RE = re.compile(r"straggler: rank (\d+) takes ([0-9.]+)s of its own work per step")


def importable(module):
    """Whether PYTHON_EXEC (the workers' interpreter) has `module`, and if not, why."""
    res = subprocess.run([e2e_lib.PYTHON_EXEC, "-c", "import " + module], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    return res.returncode == 0, (res.stderr.strip().splitlines() or ["?"])[-1]


class LightningAccelerateTest(e2e_lib.E2ETestCase):

    def need(self, module):
        ok, why = importable(module)
        if not ok:
            self.skipTest("%s is not installed for %s, torch %s (%s); the torch 2.x tier (tests/torch2) runs "
                          "this" % (module, e2e_lib.PYTHON_EXEC, e2e_lib.torch_version(), why))

    def job(self, source, flags, args, nproc):
        prog = os.path.join(self.tmp, "job.py")
        with open(prog, "w") as f:
            f.write(source)
        out = os.path.join(self.tmp, "out")
        os.makedirs(out, exist_ok=True)
        env = self.base_env(PYTHONPATH=os.path.join(REPO, "python"))
        res = self.ddprun(["--standalone", "--nproc_per_node=%d" % nproc] + flags, e2e_lib.PYTHON_EXEC,
                          [prog] + args(out), env=env, timeout=240)
        return res, out

    def results(self, out, nproc, res):
        found = {}
        for rank in range(nproc):
            path = os.path.join(out, "rank_%d.json" % rank)
            self.assertTrue(os.path.exists(path), "rank %d wrote no result\n%s" % (rank, res.describe()))
            found[rank] = e2e_lib.read_json(path)
        return found

    def test_lightning_ddp_beats_per_batch_keep_a_short_hang_timeout_quiet(self):
        self.need("lightning")
        # 5 epochs x 32 batches x 50 ms: longer than --hang_timeout=5. The first beat arms the
        # detector (the checkpoint case below shows a silent rank is then caught), so only a beat
        # per batch keeps these ranks from being declared hung.
        res, out = self.job(LIGHTNING_JOB, ["--hang_timeout=5"], lambda out: ["beats", out], 2)
        self.assertSucceeded(res)
        self.assertNotIn("no heartbeat for", res.stderr, res.describe())  # no rank was found hung
        found = self.results(out, 2, res)
        self.assertEqual({r["world"] for r in found.values()}, {2})
        self.assertEqual(found[0]["steps"], 5 * 32)  # 512 samples / 8 per batch / 2 ranks, 5 epochs
        self.assertEqual(found[0]["weights"], found[1]["weights"], "DDP's ranks diverged")

    def test_lightning_work_after_the_last_batch_is_not_a_hang_under_auto(self):
        # --hang_timeout=auto learns the training loop's bound (50 ms beats: the 3 s floor). What
        # follows the last batch (on_train_end's 6 s here; Lightning's teardown, a final upload) is
        # the callback's section "teardown", which has a bound of its own. It was the training
        # loop's silence, and a finished job was declared hung at its end.
        self.need("lightning")
        res, out = self.job(LIGHTNING_JOB, ["--hang_timeout=auto"], lambda out: ["long_end", out], 2)
        self.assertSucceeded(res)
        self.assertNotIn("no heartbeat for", res.stderr, res.describe())  # no rank was found hung
        self.assertEqual(len(self.results(out, 2, res)), 2)

    def test_lightning_step_times_name_the_straggler(self):
        self.need("lightning")
        res, out = self.job(LIGHTNING_JOB, [], lambda out: ["straggler", out], 3)
        self.assertSucceeded(res)
        self.assertEqual(sorted({int(m.group(1)) for m in STRAGGLER_RE.finditer(res.stderr)}), [1], res.describe())

    def test_lightning_rank_stuck_saving_a_checkpoint_is_hung_in_the_checkpoint_section(self):
        self.need("lightning")
        res, out = self.job(LIGHTNING_JOB, ["--hang_timeout=3"], lambda out: ["stuck_checkpoint", out], 2)
        self.assertEqual(res.returncode, 124, res.describe())
        self.assertRegex(res.stderr, r"rank\s*:\s*1\b", res.describe())
        self.assertIn("in section 'checkpoint'", res.stderr, res.describe())
        self.assertEqual(res.leaked, [], res.describe())

    def test_accelerate_job_sees_the_world_ddprun_gives_it(self):
        self.need("accelerate")
        res, out = self.job(ACCELERATE_JOB, [], lambda out: [out], 2)
        self.assertSucceeded(res)
        found = self.results(out, 2, res)
        for rank, r in found.items():
            self.assertEqual((r["processes"], r["gathered"]), (2, [0, 1]), r)
            self.assertIn("MULTI_CPU", r["type"])
            self.assertEqual(r["steps"], 3 * 8)  # 256 samples / 16 per batch / 2 ranks, 3 epochs
        self.assertEqual(found[0]["weights"], found[1]["weights"], "the ranks diverged")


if __name__ == "__main__":
    e2e_lib.main()
