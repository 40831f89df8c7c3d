"""--exclude_node_after=K: a node whose workers caused K failures of the job (the first failure of
each round counts) is excluded: its agent exits 201 (README "Exit status"), the rendezvous refuses
its host for the job's life (an agent restarted there has a new node id and is refused too), and
the job goes on without spending a restart: a standby node (one that joined a full round) takes
its place. Every node is a real ddprun agent on loopback, on one ddprun-rdzv.

On loopback every agent has the same host (127.0.0.1): the re-join below shows that an agent on
the excluded host is refused, not that agents of other hosts still get in (the state machine's
unit tests show that: tests/unit/state_machine_test.cc, "exclusion: ...")."""

import os
import time

import multinode_lib as ml
from ddprun_testlib import main

EXIT_EXCLUDED = 201

# Node b's workers always fail half a second in; a's and c's finish after 3 s (in a round with b,
# b's failure stops them first).
WORKER = r"""#!/bin/sh
echo "$NODE_TAG $TORCHELASTIC_RESTART_COUNT $RANK $WORLD_SIZE $DDPRUN_ROUND" >> "%(d)s/rec_$NODE_TAG"
if [ "$NODE_TAG" = "b" ]; then sleep 0.5; echo "b fails" >&2; exit 3; fi
sleep 3
exit 0
"""


class ExclusionTest(ml.MultiNodeTestCase):
    def wait_for(self, predicate, what, jobs, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        self.fail("timed out waiting for %s\n%s" % (what, self.describe_all(jobs)))

    def lines(self, tag):
        try:
            with open(os.path.join(self.tmp, "rec_" + tag)) as f:
                return [l.split() for l in f]
        except FileNotFoundError:
            return []

    def test_a_failing_node_is_excluded_and_a_standby_takes_its_place(self):
        port = ml.free_port()
        ml.Daemon(self, port)
        prog = self.script("w.sh", WORKER % {"d": self.tmp})
        args = self.elastic_args("2:2", port, extra=("--max_restarts=3", "--exclude_node_after=2")) + [prog]
        a = self.agent("a", args)
        b = self.agent("b", args)
        jobs = [a, b]
        self.wait_for(lambda: self.lines("a") and self.lines("b"), "the first round of a and b", jobs)
        c = self.agent("c", args)  # the round is full: c waits as a standby
        jobs.append(c)
        excluded = b.wait(60)
        self.assertEqual(excluded.returncode, EXIT_EXCLUDED, self.describe_all(jobs))
        self.assertIn("--exclude_node_after=2", excluded.stderr, self.describe_all(jobs))
        self.assertIn("the job goes on without this node", excluded.stderr, self.describe_all(jobs))
        # While a and c run on, an agent started again on b's host (another node id) is refused
        # at once, starting nothing.
        again = self.agent("b", args)
        jobs.append(again)
        res = again.wait(30)
        self.assertEqual(res.returncode, EXIT_EXCLUDED, res.describe())
        self.assertIn("is excluded from job", res.stderr, res.describe())
        results = self.wait_all([a, c], 90)
        described = self.describe_all(jobs)
        self.assertEqual([r.returncode for r in results], [0, 0], described)
        # b ran twice (attempts 0 and 1), then never again; c ran in the last round, with a.
        self.assertEqual([l[1] for l in self.lines("b")], ["0", "1"], described)
        last_round = max(int(l[4]) for l in self.lines("a"))
        self.assertIn(last_round, [int(l[4]) for l in self.lines("c")], described)
        # The exclusion spent no restart: the last round still counts 1.
        self.assertEqual([l[1] for l in self.lines("c")], ["1"], described)
        self.assert_no_leftovers(jobs)

if __name__ == "__main__":
    main()
