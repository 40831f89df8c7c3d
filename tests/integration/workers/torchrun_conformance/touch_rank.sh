#!/bin/sh
# Conformance worker (tests/integration/test_torchrun_conformance.py): what PyTorch's
# test/distributed/launcher/bin/test_script.sh does, written afresh. Run with --no-python.
# Usage: touch_rank.sh DIR    creates DIR/$RANK and says "creating DIR/$RANK" on stdout.
target="$1/$RANK"
echo "creating $target"
: > "$target"
