"""A torch job for test_torch_store.py: init_process_group("gloo") through env://, as users write it.

argv: MODE OUT_DIR. Each rank writes OUT_DIR/rank<N>.json with what it saw.
  ddp          a DDP model, 3 steps; the parameters must agree on every rank
  rank0_leaves rank 0 exits 0 right after a barrier; the others go on using the store after it left
  wait_missing rank 0 exits 0 after a barrier; the others wait 3 s for a key nobody sets
  rank0_killed rank 0 is SIGKILLed after a barrier while the others wait 600 s for a key nobody sets
  stranger     rank 0 writes the store's address to OUT_DIR/address and waits for OUT_DIR/go
"""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

mode, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
store = dist.distributed_c10d._get_default_store()
seen = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "RANK")}
seen["pid"] = os.getpid()


def done(**extra):
    seen.update(extra)
    with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
        json.dump(seen, f)


if mode == "ddp":
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        g = torch.Generator().manual_seed(step * world + rank)
        loss = model(torch.randn(8, 4, generator=g)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    done(agree=all(torch.equal(gathered[0], g) for g in gathered))
    dist.destroy_process_group()
    # torch 2.x's gloo threads can outlive destroy_process_group and drop the last work's tensors
    # during the interpreter's exit: SIGABRT, "terminate called without an active exception", in
    # 2 runs of 30 under --torch_store=rank0 (torchrun's own store) and 1 of 30 under the agent's
    # (pytorch/pytorch#190489; it failed this test in CI). Not this test's subject: leave at once.
    sys.stdout.flush()
    os._exit(0)
elif mode in ("rank0_leaves", "wait_missing"):
    dist.barrier()
    if rank == 0:
        done(left=True)
        os._exit(0)  # gone, with its sockets: under --torch_store=rank0 the store goes with it
    time.sleep(1.0)
    if mode == "rank0_leaves":
        store.set("after/%d" % rank, str(rank))
        others = [r for r in range(1, world) if r != rank]
        got = {r: store.get("after/%d" % r).decode() for r in others}
        done(kept=all(got[r] == str(r) for r in others), added=store.add("after/count", 1))
    else:
        start = time.monotonic()
        try:
            store.wait(["never/set"], datetime.timedelta(seconds=3))
            done(error=None)
        except Exception as e:  # torch's timeout: RuntimeError (1.13), DistStoreError (2.x)
            done(error=str(e), waited=time.monotonic() - start)
    os._exit(0)  # no destroy: rank 0 is gone
elif mode == "rank0_killed":
    dist.barrier()
    if rank == 0:
        done(killed=True)
        os.kill(os.getpid(), 9)
    done(waiting=True)
    store.wait(["never/set"], datetime.timedelta(seconds=600))  # ended by the agent, not by this timeout
elif mode == "stranger":
    if rank == 0:
        with open(os.path.join(out, "address.tmp"), "w") as f:
            f.write("%s %s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]))
        os.rename(os.path.join(out, "address.tmp"), os.path.join(out, "address"))
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
            time.sleep(0.05)
    dist.barrier()  # the store still serves the job after a stranger was refused
    done(ok=True)
    dist.destroy_process_group()
