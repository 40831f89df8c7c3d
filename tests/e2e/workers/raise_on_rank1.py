"""Worker for test_torch_failures: a DDP-style script whose rank 1 raises inside a function
decorated with torchelastic's @record, which writes the exception to TORCHELASTIC_ERROR_FILE.
Usage: raise_on_rank1.py TOKEN   (TOKEN goes into the exception message)."""

import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def check_inputs(rank, token):
    if rank == 1:
        raise RuntimeError("rank 1 found a corrupt shard (token %s)" % token)


@record
def main():
    token = sys.argv[1]
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)  # a real collective first: the group is up when rank 1 fails
    if t.item() != dist.get_world_size():
        raise RuntimeError("all_reduce gave %s" % t.item())
    check_inputs(dist.get_rank(), token)
    dist.barrier()  # the other ranks wait here for rank 1, which never comes
    print("rank %d got past the barrier" % dist.get_rank(), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001  (@record has written the error file; report and fail as Python would)
        # Exit 1 as an uncaught exception does, without the interpreter's finalization: in it torch
        # 2.15 at times aborts (SIGABRT, "terminate called without an active exception": gloo's
        # thread frees the last work late and takes the GIL from a finalizing thread,
        # pytorch/pytorch#190489). It turned this test's exit 1 into 134 in a CI run.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
