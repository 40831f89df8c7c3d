"""Conformance worker (tests/integration/test_torchrun_conformance.py): the behaviour of PyTorch's
test/distributed/launcher/bin/test_script_init_method.py, written afresh.

Usage: init_method.py --init-method=URL [--world-size=N] [--rank=R]   (underscore spellings too)
World size and rank default to WORLD_SIZE and RANK. It joins a gloo process group through URL,
all-reduces a one-hot vector of its rank and checks that the sum is the world size, then prints
"Done". Any failure is an exception (exit 1).
"""
import argparse
import os

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-method", "--init_method", dest="init_method", required=True)
    parser.add_argument("--world-size", "--world_size", dest="world_size", type=int,
                        default=int(os.environ.get("WORLD_SIZE", -1)))
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", -1)))
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method=args.init_method, world_size=args.world_size, rank=args.rank)
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.zeros(world, dtype=torch.int64)
    mine[rank] = 1
    dist.all_reduce(mine)
    if int(mine.sum()) != world:
        raise RuntimeError("all_reduce of one-hot vectors gave %s, expected %d ones" % (mine.tolist(), world))
    dist.destroy_process_group()
    print("Done")


if __name__ == "__main__":
    main()
