"""What the in-process recovery tests read back from their workers (examples/torch/recoverable_ddp.py
and tests/integration/workers/recoverable_trainer log the same two things)."""

import os
import re


def read_starts(path):
    """[(rank, pid, restart)]: one line per process that became a rank ("rank pid restart";
    a spare's start logs rank -1). Empty when nothing was logged."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [tuple(int(x) for x in line.split()) for line in f if len(line.split()) == 3]


def last_digest(text):
    """The last "digest HEX" that rank 0 printed, or None."""
    found = re.findall(r"digest ([0-9a-f]{16})", text)
    return found[-1] if found else None
