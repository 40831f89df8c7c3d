"""Conformance worker (tests/integration/test_torchrun_conformance.py): the behaviour of PyTorch's
test/distributed/launcher/bin/test_script_local_rank.py, written afresh: a script written for
`python -m torch.distributed.launch`, which finds its local rank in argv.

Usage: local_rank_arg.py --local-rank=N | --local_rank=N
torch.distributed.launch passes --local_rank in torch 1.x and --local-rank from torch 2.0 on; this
script takes either (as PyTorch's own does since 2.0) and prints the spelling it was given, which
the test checks against the torch version of the interpreter. It fails (exit 1) when the value
differs from LOCAL_RANK, and argparse fails (exit 2) when neither flag is there.
"""
import argparse
import os
import sys


def main():
    spelling = [a.split("=", 1)[0] for a in sys.argv[1:] if a.startswith(("--local-rank", "--local_rank"))]
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, required=True)
    args = parser.parse_args()
    print("Start execution")
    if args.local_rank != int(os.environ["LOCAL_RANK"]):
        raise RuntimeError("--local-rank %d differs from LOCAL_RANK=%s" % (args.local_rank, os.environ["LOCAL_RANK"]))
    print("local rank flag: %s" % ",".join(spelling))
    print("End execution")


if __name__ == "__main__":
    main()
