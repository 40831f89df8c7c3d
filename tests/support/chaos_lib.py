"""Shared by the chaos tests: a worker that records its life, and the invariants checked on it.

LIFE_WORKER (a Python worker) writes, in a directory of the test, one file per process:
    life_<node>_<round>_<local rank>_<pid>
holding "start <monotonic s> <RANK> <GROUP_RANK> <WORLD_SIZE>" and then, every BEAT_S, a line
"beat <monotonic s>" (appended; CLOCK_MONOTONIC is one clock for every process of the machine,
network namespaces included). It runs until released (a file) or for its own bound, then exits 0.
A worker's last beat is at most BEAT_S before its death, so "alive" is known to within BEAT_S.

Invariants (check_lives):
  - fencing: for two rounds r < r' of one job, every worker of r had its last beat before the
    first worker of r' started (to within BEAT_S): never two rounds with workers alive at once;
  - ranks: in each round, RANK is unique, and GROUP_RANK is one per node;
Tests add their own: documented exit codes within a bound, no process left (multinode_lib).
"""

import os
import sys
import time


import multinode_lib as ml  # noqa: E402,F401  (re-exported for the tests)

BEAT_S = 0.05

LIFE_WORKER = r"""
import os, signal, sys, time
d, hold_s = sys.argv[1], float(sys.argv[2])
# Optional: seconds a SIGTERM is outlived (a worker saving a checkpoint), and "node:round:local
# rank:after s" to exit 1 after that long (a worker failure).
term_grace = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
fail = sys.argv[4].split(":") if len(sys.argv) > 4 else None
e = os.environ
name = "life_%%s_%%s_%%s_%%d" %% (e["NODE_TAG"], e["DDPRUN_ROUND"], e["LOCAL_RANK"], os.getpid())
path = os.path.join(d, name)
term_at = []
if term_grace > 0:
    signal.signal(signal.SIGTERM, lambda *_: term_at.append(time.monotonic()))
fail_at = None
if fail and fail[:3] == [e["NODE_TAG"], e["DDPRUN_ROUND"], e["LOCAL_RANK"]]:
    fail_at = time.monotonic() + float(fail[3])
with open(path, "a", buffering=1) as f:
    f.write("start %%.6f %%s %%s %%s\n" %% (time.monotonic(), e["RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]))
    end = time.monotonic() + hold_s
    while time.monotonic() < end and not os.path.exists(os.path.join(d, "release")):
        now = time.monotonic()
        f.write("beat %%.6f\n" %% now)
        if term_at and now >= term_at[0] + term_grace:
            os._exit(143)
        if fail_at is not None and now >= fail_at:
            os._exit(1)
        time.sleep(%(beat)s)
""" % {"beat": BEAT_S}


def read_lives(directory):
    """Every worker's life: dicts with node, round, local_rank, pid, start, last (beat), rank,
    group_rank, world."""
    lives = []
    for name in os.listdir(directory):
        if not name.startswith("life_"):
            continue
        _, node, rnd, local_rank, pid = name.split("_")
        start, last, rank, group_rank, world = None, None, None, None, None
        with open(os.path.join(directory, name)) as f:
            for line in f:
                parts = line.split()
                if not line.endswith("\n") or not parts:
                    continue  # being written
                if parts[0] == "start" and len(parts) == 5:
                    start, rank, group_rank, world = float(parts[1]), int(parts[2]), int(parts[3]), int(parts[4])
                    last = start
                elif parts[0] == "beat" and len(parts) == 2:
                    last = float(parts[1])
        if start is not None:
            lives.append(dict(node=node, round=int(rnd), local_rank=int(local_rank), pid=int(pid), start=start,
                              last=last, rank=rank, group_rank=group_rank, world=world))
    return lives


def fencing_violations(lives):
    """Pairs of (older worker, newer round) where the older worker was alive when the newer round's
    first worker started."""
    rounds = sorted({lv["round"] for lv in lives})
    first_start = {r: min(lv["start"] for lv in lives if lv["round"] == r) for r in rounds}
    bad = []
    for lv in lives:
        for r in rounds:
            if r > lv["round"] and lv["last"] >= first_start[r]:
                bad.append("worker pid %d (node %s, round %d) beat at %.3f, %.3f s after round %d started" % (
                    lv["pid"], lv["node"], lv["round"], lv["last"], lv["last"] - first_start[r], r))
    return bad


def rank_violations(lives):
    bad = []
    for r in sorted({lv["round"] for lv in lives}):
        in_round = [lv for lv in lives if lv["round"] == r]
        ranks = [lv["rank"] for lv in in_round]
        if len(ranks) != len(set(ranks)):
            bad.append("round %d: RANK repeated: %s" % (r, sorted(ranks)))
        by_group = {}
        for lv in in_round:
            by_group.setdefault(lv["group_rank"], set()).add(lv["node"])
        for g, nodes in by_group.items():
            if len(nodes) > 1:
                bad.append("round %d: GROUP_RANK %d on nodes %s" % (r, g, sorted(nodes)))
    return bad


def check_lives(test, directory, what=""):
    lives = read_lives(directory)
    test.assertTrue(lives, "no worker ever started " + what)
    problems = fencing_violations(lives) + rank_violations(lives)
    test.assertEqual(problems, [], "invariants broken %s:\n%s" % (what, "\n".join(problems)))
    return lives


class ChaosTestCase(ml.MultiNodeTestCase):
    """A multi-node test whose workers record their lives in self.tmp (LIFE_WORKER)."""

    def wait_lives(self, predicate, jobs, what, timeout=ml.SAFETY_TIMEOUT_S):
        """Waits until predicate(read_lives(self.tmp)) holds; fails naming `what` after timeout."""
        deadline = time.monotonic() + timeout
        while not predicate(read_lives(self.tmp)):
            if time.monotonic() > deadline:
                self.fail("timed out waiting for %s\n%s" % (what, self.describe_all(jobs)))
            time.sleep(0.05)
