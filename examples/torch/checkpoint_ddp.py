#!/usr/bin/env python3
"""recoverable_ddp.py's training written the way a torchrun user writes it: restart and checkpoint.

    torchrun --standalone --nproc_per_node=4 --max_restarts=1 examples/torch/checkpoint_ddp.py --checkpoint /tmp/ck.pt
    ddprun --nproc_per_node=4 --max_restarts=1 examples/torch/checkpoint_ddp.py --checkpoint /tmp/ck.pt

Plain init_process_group("gloo") and DistributedDataParallel; no ddprun import. When a rank dies
the launcher restarts every rank, and each loads the last checkpoint (model, optimizer, steps
done), which rank 0 writes every --checkpoint_every steps (atomically: a temporary file, then
os.replace), and goes on from there: the steps since that checkpoint are done again. The model,
the optimizer (SGD with momentum), the data order (the batch of step s on rank r comes from a
generator seeded with (s, r)), the per-parameter gradient averaging and the step's length
(--step_ms) are recoverable_ddp.py's, so both end with the same parameters, failure or not. Rank 0
prints "step N" when N steps are done, and at the end "digest HEX" (the first 16 hex digits of the
sha256 of the final parameters' bytes), as recoverable_ddp.py does. bench/recovery_bench.py sets
the two side by side. It ends with a barrier and os._exit(0), not destroy_process_group(): torch
1.13 can deadlock in the group's teardown (the end of main() says how).

Test hooks (environment; RANK:STEP[:SIGNAL][@RESTART] lists, acting only while
TORCHELASTIC_RESTART_COUNT is RESTART, 0 by default: the first attempt):
    RECOVERABLE_DIE_AT=RANK:STEP[:SIGNAL]  that rank kills itself (SIGKILL unless a signal name or
                                           number is given) right after completing STEP steps
                                           (and after rank 0's checkpoint of that step, if due)
    RECOVERABLE_PIDS=PATH                  each process appends "rank pid restart_count" at start
    RECOVERABLE_TIMES=PATH                 each rank appends "rank step time.time()" per step done, and
                                           a dying rank "kill rank step time.time()"
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

BATCH = 32


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step_ms", type=float, default=0.0, help="make each step last about this long")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout_s", type=float, default=30.0, help="the process group's timeout")
    p.add_argument("--checkpoint", default="checkpoint_ddp.pt", help="the checkpoint's path")
    p.add_argument("--checkpoint_every", type=int, default=10, help="rank 0 saves every K steps; 0: never")
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
    """DDP's gradient averaging, one all_reduce per parameter: recoverable_ddp.py's hook (see there),
    kept so that the two scripts do the same work per step and end with the same parameters."""
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


def save_checkpoint(path, model, optimizer, step):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)  # atomic: a reader sees the old checkpoint or the new one, never half of one


def main(argv=None):
    args = parse_args(argv)
    pids = os.environ.get("RECOVERABLE_PIDS")
    if pids:
        with open(pids, "a") as f:
            f.write("%s %d %s\n" % (os.environ.get("RANK", "?"), os.getpid(),
                                    os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    times_path = os.environ.get("RECOVERABLE_TIMES")
    times = open(times_path, "a") if times_path else None

    from datetime import timedelta
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()
    start_step = 0
    if os.path.exists(args.checkpoint):  # every rank loads it (rank 0 writes it only after DDP's sync below)
        ck = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        start_step = ck["step"]
    ddp = DDP(model)
    ddp.register_comm_hook(None, per_parameter_mean)

    die = hooks("RECOVERABLE_DIE_AT")
    for s in range(start_step, args.steps):
        start = time.monotonic()
        x, y = batch(s, rank)
        optimizer.zero_grad()
        loss_fn(ddp(x), y).backward()
        optimizer.step()
        left = args.step_ms / 1000.0 - (time.monotonic() - start)
        if left > 0:
            time.sleep(left)
        done = s + 1
        if rank == 0 and args.checkpoint_every > 0 and done % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint, model, optimizer, done)
        if times:
            times.write("%d %d %.6f\n" % (rank, done, time.time()))
            times.flush()
        if rank == 0:
            print("step %d" % done, flush=True)
        here = (rank, done)
        if here in die:
            if times:
                times.write("kill %d %d %.6f\n" % (here + (time.time(),)))
                times.flush()
            name = die[here] or "SIGKILL"
            sig = int(name) if name.isdigit() else getattr(signal, name if name.startswith("SIG") else "SIG" + name)
            os.kill(os.getpid(), sig)

    if rank == 0:
        print("digest %s" % digest(model), flush=True)
    # The process ends here, without tearing down the group: torch 1.13 can deadlock in that
    # teardown. Caught in a job restarted after a lost node, about 1 in 30 under load
    # (bench/recovery_lost_node_bench.py, gdb): the main thread, holding the GIL, runs
    # ~Reducer -> ~ProcessGroupGloo -> std::thread::join, while the gloo thread it joins is in
    # runLoop -> ~TensorImpl -> destroy_pyobj_if_needed -> PyEval_AcquireThread, waiting for that
    # GIL. Whatever order the script frees DDP and the group in, the last reference to the group
    # goes on a thread that holds the GIL. After the barrier every rank is past its last
    # collective, so nothing is left for the kernel's close of the sockets to cut short.
    dist.barrier()
    if times:
        times.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
