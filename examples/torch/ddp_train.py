#!/usr/bin/env python3
"""A plain PyTorch DistributedDataParallel training script, written as users write them.

Run it under any torchrun-compatible launcher:

    ddprun   --standalone --nproc_per_node=4 examples/torch/ddp_train.py --out /tmp/model.pt
    torchrun --standalone --nproc_per_node=4 examples/torch/ddp_train.py --out /tmp/model.pt

It uses nothing but torch: `dist.init_process_group("gloo")` reads the launcher's environment
(env://), a DistributedSampler splits a synthetic, seeded regression data set, DDP averages the
gradients. Before training it checks the collectives (all_reduce, broadcast, all_gather, barrier)
and raises if one returns a wrong value; after training it checks that every rank holds the same
weights.

The result does not depend on the world size. Each step consumes one global batch of
--global_batch samples, split evenly over the ranks (DistributedSampler without shuffling gives
rank r the samples r, r+W, r+2W, ..., so step b of every rank together covers exactly samples
[b*G, (b+1)*G)). Each rank's loss is the mean over its share and DDP averages the gradients, so
every step applies the gradient of the mean loss over the full global batch: the same update as
one process training on the full batch, up to float rounding (about 1e-7 relative per step).
The world size must divide --global_batch, and --global_batch must divide --samples.

Rank 0 writes the final state_dict to --out and a JSON summary to --out + ".json": the flattened
initial and final weights, the loss per epoch, the world size and TORCHELASTIC_RESTART_COUNT.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where rank 0 saves the final state_dict")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--global_batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def make_dataset(samples, seed):
    """y = tanh(x @ A) @ b + 0.1 * noise, with x, A, b, noise all drawn from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 8, generator=g)
    a = torch.randn(8, 4, generator=g)
    b = torch.randn(4, 1, generator=g)
    y = torch.tanh(x @ a) @ b + 0.1 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def make_model(seed):
    torch.manual_seed(seed)  # every rank builds the same initial weights (DDP broadcasts rank 0's anyway)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def flat_weights(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def check(condition, what):
    if not condition:
        raise RuntimeError("collective check failed: " + what)


def check_collectives(rank, world):
    # all_reduce (sum): every rank contributes rank + 1.
    t = torch.tensor([float(rank + 1), 2.0])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    check(t.tolist() == [world * (world + 1) / 2.0, 2.0 * world], "all_reduce sum gave %s" % t.tolist())

    # all_reduce (max)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check(t.item() == world - 1, "all_reduce max gave %s" % t.item())

    # broadcast from the last rank: only it holds the payload before the call.
    src = world - 1
    t = torch.arange(5, dtype=torch.float32) * 7 + 3 if rank == src else torch.zeros(5)
    dist.broadcast(t, src=src)
    check(t.tolist() == [3.0, 10.0, 17.0, 24.0, 31.0], "broadcast gave %s" % t.tolist())

    # all_gather: rank r contributes [10r, 10r+1, 10r+2].
    mine = torch.arange(3, dtype=torch.float32) + 10 * rank
    gathered = [torch.empty(3) for _ in range(world)]
    dist.all_gather(gathered, mine)
    for r, got in enumerate(gathered):
        check(got.tolist() == [10.0 * r, 10.0 * r + 1, 10.0 * r + 2], "all_gather slot %d gave %s" % (r, got.tolist()))

    dist.barrier()


def check_replicas_equal(model, world):
    """After training, DDP must have kept every rank's weights identical. Returns the tensors the
    all_gather used (see the teardown note in train())."""
    mine = flat_weights(model)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    for r, got in enumerate(gathered):
        check(torch.equal(got, gathered[0]), "rank %d's weights differ from rank 0's after training" % r)
    return [mine] + gathered


def train(args, on_epoch_end=None):
    """Trains and returns the losses; on_epoch_end(epoch, loss) is a hook for tests."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world or args.samples % args.global_batch:
        raise ValueError("world size %d must divide --global_batch %d, which must divide --samples %d"
                         % (world, args.global_batch, args.samples))
    torch.set_num_threads(1)
    check_collectives(rank, world)

    dataset = make_dataset(args.samples, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=args.global_batch // world, sampler=sampler)

    model = make_model(args.seed + 1)
    initial = flat_weights(model).clone()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    losses = []
    total = None
    start = time.time()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(x), float(len(x))])
        dist.all_reduce(total)  # the epoch's mean loss over all samples, not just this rank's
        epoch_loss = (total[0] / total[1]).item()
        check(int(total[1].item()) == args.samples, "epoch saw %d samples" % total[1].item())
        losses.append(epoch_loss)
        if rank == 0:
            print("epoch %d loss %.6f" % (epoch, epoch_loss), flush=True)
        if on_epoch_end:
            on_epoch_end(epoch, epoch_loss)

    last_collective_tensors = check_replicas_equal(model, world)
    if rank == 0:
        torch.save(model.state_dict(), args.out)
        summary = {
            "world_size": world,
            "restart_count": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
            "losses": losses,
            "initial_weights": initial.tolist(),
            "final_weights": flat_weights(model).tolist(),
            "train_seconds": time.time() - start,
        }
        tmp = args.out + ".json.tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f)
        os.replace(tmp, args.out + ".json")
        print("saved %s and %s.json" % (args.out, args.out), flush=True)
    dist.barrier()
    # Teardown order matters with torch 1.13's gloo backend: destroying the process group joins
    # its worker threads while holding the GIL, and a worker thread that drops the last reference
    # to a tensor Python has already released needs the GIL to free it: a deadlock, seen about
    # once in dozens of runs on a loaded machine. So the DDP wrapper (which holds a reference to
    # the group) goes first, and the tensors of the last collectives stay alive until the group
    # is gone.
    del ddp, opt
    dist.destroy_process_group()
    del last_collective_tensors, total
    return losses


def main(argv=None):
    train(parse_args(argv))


if __name__ == "__main__":
    main()
    # The group is destroyed and every output written: the process ends here, without the
    # interpreter's finalization, in which torch 2.15 at times aborts ("terminate called without an
    # active exception": a gloo work freed late takes the GIL from a finalizing thread,
    # pytorch/pytorch#190489). Seen under torchrun as under ddprun (a CI run of test_torch_ddp).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
