"""Conformance worker (tests/integration/test_torchrun_conformance.py): the behaviour of the
script that PyTorch's launcher tests run most (test/distributed/launcher/bin/test_script.py),
written afresh.

Usage: touch_rank.py [--touch-file-dir DIR | --touch_file_dir DIR] [--fail]
It requires every variable a torchrun worker is promised (and the sentinel the test set on the
launcher), prints them, and then either fails with a RuntimeError (--fail; exit status 1) or
creates DIR/<RANK>, an empty file named after its global rank.
"""
import argparse
import os
import sys

PROMISED = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
            "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "TEST_SENTINEL_PARENT",
            "TORCHELASTIC_ERROR_FILE")


def main():
    parser = argparse.ArgumentParser()
    # PyTorch's test passes --touch_file_dir in torch 1.13 and --touch-file-dir in torch 2.x.
    parser.add_argument("--touch-file-dir", "--touch_file_dir", dest="touch_file_dir")
    parser.add_argument("--fail", action="store_true")
    args = parser.parse_args()

    missing = [name for name in PROMISED if name not in os.environ]
    if missing:
        sys.exit("touch_rank.py: missing from the environment: %s" % " ".join(missing))
    for name in PROMISED:
        print("%s=%s" % (name, os.environ[name]))

    if args.fail:
        raise RuntimeError("touch_rank.py was asked to fail (--fail)")
    if not args.touch_file_dir:
        sys.exit("touch_rank.py: --touch-file-dir is required without --fail")
    target = os.path.join(args.touch_file_dir, os.environ["RANK"])
    open(target, "a").close()
    print("touched %s" % target)


if __name__ == "__main__":
    main()
