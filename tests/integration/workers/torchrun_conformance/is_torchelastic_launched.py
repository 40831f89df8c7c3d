"""Conformance worker (tests/integration/test_torchrun_conformance.py): the behaviour of PyTorch's
test/distributed/launcher/bin/test_script_is_torchelastic_launched.py, written afresh.

Usage: is_torchelastic_launched.py --out-file=PATH | --out_file=PATH
Writes str(torch.distributed.is_torchelastic_launched()) ("True" or "False", no newline) to PATH.
That function exists in every torch this suite runs under (1.13 and 2.x); if an interpreter's torch
lacks it, the script writes "unavailable" and the test skips.
"""
import argparse

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-file", "--out_file", dest="out_file", required=True)
    args = parser.parse_args()
    probe = getattr(dist, "is_torchelastic_launched", None)
    with open(args.out_file, "w") as out:
        out.write(str(probe()) if probe else "unavailable")


if __name__ == "__main__":
    main()
