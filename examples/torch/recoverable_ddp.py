#!/usr/bin/env python3
"""A DistributedDataParallel training script that survives the loss of a rank in-process.

    ddprun --recovery=in_process --standalone --nproc_per_node=4 examples/torch/recoverable_ddp.py
    torchrun --standalone --nproc_per_node=4 examples/torch/recoverable_ddp.py   # no recovery

It trains under ddprun.recovery.run (python/ddprun/recovery.py): when a rank dies, the others keep
their processes, ddprun starts a replacement, and every rank resumes from the last step that the
furthest rank committed, with its model and optimizer state (SGD with momentum: the optimizer's
state matters). Gloo on CPU. The batch of step s on rank r comes from a generator seeded with
(s, r), so the data order depends on the step alone, and a recovered run ends with the same
parameters as an uninterrupted one of the same world size. Rank 0 prints "step N" when N steps
are done, and at the end "digest HEX": the first 16 hex digits of the sha256 of the final
parameters' bytes.

Test hooks (environment; each is a comma-separated list of RANK:STEP[:X][@RESTART], acting only
while TORCHELASTIC_RESTART_COUNT is RESTART, 0 by default, i.e. before any recovery or restart, so
that a replacement does not fail again):
    RECOVERABLE_DIE_AT=RANK:STEP[:SIGNAL]  that rank kills itself (SIGKILL unless a signal name or
                                           number is given) right after committing STEP steps
    RECOVERABLE_RAISE_AT=RANK:STEP         that rank raises RuntimeError there instead
    RECOVERABLE_HANG_AT=RANK:STEP          that rank stops there (sleeps, beating no more)
    RECOVERABLE_PIDS=PATH                  each process appends "rank pid restart_count" at start;
                                           a warm spare, which has no rank yet, appends rank -1 once it
                                           is ready (its model and optimizer made: torch 2.x imports
                                           its compiler there) and its rank's line once it becomes one
    RECOVERABLE_TIMES=PATH                 each rank appends "rank step time.time()" per step done, and
                                           a dying rank "kill rank step time.time()" (bench/recovery_bench.py)
"""

import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddprun.recovery as recovery

BATCH = 32


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step_ms", type=float, default=0.0, help="make each step last about this long")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout_s", type=float, default=30.0, help="the process group's timeout")
    p.add_argument("--notice_timeout_s", type=float, default=60.0, help="how long a failed rank waits for a new round")
    return p.parse_args(argv)


def hooks(name):
    """{(rank, step): extra} of the RANK:STEP[:X][@RESTART] hooks in `name` that apply now."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    out = {}
    for item in filter(None, os.environ.get(name, "").split(",")):
        spec, _, when = item.partition("@")
        if (when or "0") != restart:
            continue
        parts = spec.split(":")
        out[int(parts[0]), int(parts[1])] = parts[2] if len(parts) > 2 else None
    return out


def batch(step, rank):
    g = torch.Generator().manual_seed(step * 1000003 + rank)
    x = torch.randn(BATCH, 16, generator=g)
    y = torch.tanh(x[:, :4].sum(dim=1, keepdim=True)) + 0.1 * torch.randn(BATCH, 1, generator=g)
    return x, y


def per_parameter_mean(group, bucket):
    """DDP's gradient averaging, one all_reduce per parameter. Why: the ring sums an element in an
    order set by its place in DDP's bucket, and a new DDP (the next round, after a recovery) lays its
    buckets out afresh, so its float sums may differ in the last bit from the run that never
    failed. Per parameter, each element's order is the same in every round: the final parameters
    are bit-identical to a run without a failure (the digest shows it). Without this hook recovery
    works the same; only the last bits may differ."""
    world = dist.get_world_size(group)
    for grad in bucket.gradients():
        dist.all_reduce(grad, group=group)
    buffer = bucket.buffer()
    buffer.div_(world)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv=None):
    args = parse_args(argv)
    pids = os.environ.get("RECOVERABLE_PIDS")

    def log_start(rank, restart):
        if pids:
            with open(pids, "a") as f:
                f.write("%s %d %s\n" % (rank, os.getpid(), restart))

    spare = [os.environ.get("DDPRUN_SPARE") == "1"]  # logged when ready, and again once it is a rank
    if not spare[0]:
        log_start(os.environ.get("RANK", "-1"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(args.seed)  # the same initial weights everywhere (the sync broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = recovery.State(model=model, optimizer=optimizer)
    loss_fn = nn.MSELoss()

    times_path = os.environ.get("RECOVERABLE_TIMES")
    times = open(times_path, "a") if times_path else None

    def train(ctx):
        if spare[0]:
            spare[0] = False
            log_start(ctx.rank, ctx.restart_count)
        # Read at each round's start: a recovery sets the new TORCHELASTIC_RESTART_COUNT.
        die, fail, hang = hooks("RECOVERABLE_DIE_AT"), hooks("RECOVERABLE_RAISE_AT"), hooks("RECOVERABLE_HANG_AT")
        ddp = DDP(model)  # per round: it holds the round's process group
        ddp.register_comm_hook(None, per_parameter_mean)
        for s in range(ctx.step, args.steps):
            start = time.monotonic()
            x, y = batch(s, ctx.rank)
            optimizer.zero_grad()
            loss_fn(ddp(x), y).backward()
            optimizer.step()
            left = args.step_ms / 1000.0 - (time.monotonic() - start)
            if left > 0:
                time.sleep(left)
            ctx.commit(s + 1)
            if times:
                times.write("%d %d %.6f\n" % (ctx.rank, s + 1, time.time()))
                times.flush()
            if ctx.rank == 0:
                print("step %d" % (s + 1), flush=True)
            here = (ctx.rank, s + 1)
            if here in die:
                if times:
                    times.write("kill %d %d %.6f\n" % (here + (time.time(),)))
                    times.flush()
                name = die[here] or "SIGKILL"
                sig = int(name) if name.isdigit() else getattr(signal, name if name.startswith("SIG") else "SIG" + name)
                os.kill(os.getpid(), sig)
            if here in fail:
                raise RuntimeError("RECOVERABLE_RAISE_AT: rank %d raises after step %d" % here)
            if here in hang:
                time.sleep(3600)
        return ctx.rank

    if spare[0]:
        log_start(-1, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = recovery.run(train, state, timeout_s=args.timeout_s, notice_timeout_s=args.notice_timeout_s)
    if rank == 0:
        print("digest %s" % digest(model), flush=True)


if __name__ == "__main__":
    main()
    # run() destroyed the group and the digest is out: end here, without the interpreter's
    # finalization, in which torch 2.15 at times aborts (pytorch/pytorch#190489; see ddp_train.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
