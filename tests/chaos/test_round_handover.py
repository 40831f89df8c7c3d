"""The hand-over between two rounds: no worker of the new round starts on any node while a worker
of the old round still runs on another (agents on loopback, one ddprun-rdzv daemon).

The workers (chaos_lib.LIFE_WORKER) outlive a SIGTERM by TERM_GRACE_S, as a worker saving a
checkpoint does, so a node takes that long to stop; the agents' shutdown grace is longer. A round
ends for one of the three reasons a running job changes:
  - a node joins (scale-up): the newcomer has no workers to stop, so only the server can hold its
    first workers back until the old round's are gone everywhere;
  - a worker fails on one node: that node's workers stop at once, its peer's take TERM_GRACE_S;
  - a node leaves (its agent is stopped by a signal): its workers take TERM_GRACE_S, the
    survivors' stop at once and must not start the next round before the leaver's are gone.
Checked every time: chaos_lib.check_lives (never two rounds with workers alive at once, unique
ranks), documented exit codes, nothing left. On the old code (a round after an interruption
closed at once, whatever the members' workers were doing) each of the three started the new
round's workers while old ones still ran, every time.
"""

import signal
import sys

import chaos_lib as cl
from chaos_lib import ml
from ddprun_testlib import main

TERM_GRACE_S = 1.0
HOLD_S = 60


class RoundHandoverTest(cl.ChaosTestCase):

    def setUp(self):
        super().setUp()
        self.port = ml.free_port()
        self.daemon = ml.Daemon(self, self.port)
        self.life = self.write_file("life.py", cl.LIFE_WORKER)

    def start(self, tag, fail="-:0:0:0", nnodes="2:3", term_grace=TERM_GRACE_S):
        args = self.elastic_args(nnodes, self.port, nproc=2, conf="last_call_timeout=1",
                                 extra=["--max_restarts=1", "--shutdown_timeout=10"])
        return self.agent(tag, args + [sys.executable, self.life, self.tmp, str(HOLD_S), str(term_grace), fail])

    def in_round(self, rnd, nodes):
        """Predicate: both workers of every node in `nodes` started in round `rnd`."""
        return lambda lives: all(len([lv for lv in lives if lv["node"] == t and lv["round"] == rnd]) == 2
                                 for t in nodes)

    def finish(self, jobs, codes):
        self.release()
        results = self.wait_all(jobs, ml.SAFETY_TIMEOUT_S)
        for code, res in zip(codes, results):
            self.assertEqual(res.returncode, code, "undocumented exit\n%s" % self.describe_all(jobs))
        self.assert_no_leftovers(jobs)
        return cl.check_lives(self, self.tmp)

    def test_a_node_joins(self):
        jobs = [self.start("a"), self.start("b")]
        self.wait_lives(self.in_round(1, "ab"), jobs, "round 1 on a and b")
        jobs.append(self.start("c"))
        self.wait_lives(self.in_round(2, "abc"), jobs, "round 2 on a, b, c")
        lives = self.finish(jobs, [0, 0, 0])
        self.assertEqual({lv["world"] for lv in lives if lv["round"] == 2}, {6})

    def test_a_worker_fails(self):
        # a's local rank 1 fails 1 s into round 1: a's other worker stops at once, b's take 1 s.
        jobs = [self.start("a", fail="a:1:1:1.0", nnodes="2:2", term_grace=0), self.start("b", nnodes="2:2")]
        self.wait_lives(self.in_round(2, "ab"), jobs, "round 2 on a and b")
        self.finish(jobs, [0, 0])

    def test_a_node_leaves(self):
        # c's workers take 1 s to stop (a checkpoint on SIGTERM); a's and b's stop at once.
        jobs = [self.start("a", term_grace=0), self.start("b", term_grace=0), self.start("c")]
        self.wait_lives(self.in_round(1, "abc"), jobs, "round 1 on a, b, c")
        jobs[2].kill(signal.SIGTERM)
        self.wait_lives(self.in_round(2, "ab"), jobs[:2], "round 2 on a and b")
        self.finish(jobs, [0, 0, 128 + signal.SIGTERM])


if __name__ == "__main__":
    main()
