"""Failures across nodes: every node is a separate ddprun agent on loopback.

- A worker failure on one node with --max_restarts=1 restarts the workers of ALL nodes, into one
  new round, with TORCHELASTIC_RESTART_COUNT=1 everywhere and stable ranks; with the budget spent
  (--max_restarts=0) every agent ends, without waiting for its workers, with the failed worker's
  exit code.
- kill -9 of a whole agent that hosts nothing (the rendezvous is a ddprun-rdzv daemon, or embedded
  in another agent): with --nnodes=2:3 the survivors restart into a smaller round as soon as the
  agent's stream breaks (not after a heartbeat timeout), without spending the restart budget;
  with --nnodes=3 they fail after join_timeout instead of hanging. No worker of the killed agent
  survives it. SIGTERM to an agent does the same as a leave (it does not close the job for the
  others); kill -9 of the agent that hosts the embedded rendezvous fails the others cleanly, with
  exit status 1 (could not run the job).

Time limits are safety timeouts (SAFETY_TIMEOUT_S), not speed claims: what the agents must not wait
for (the workers' 60 s hold, a 60 s heartbeat timeout, a 600 s join timeout) lasts far longer.
"""

import signal
import time

import multinode_lib as ml
from ddprun_testlib import main


class MultiNodeFailureTest(ml.MultiNodeTestCase):

    def start_three(self, nnodes, port, conf=None, extra=(), prog=None, nproc=2):
        prog = prog or self.recorder()
        return [self.agent(t, self.elastic_args(nnodes, port, nproc=nproc, conf=conf, extra=extra) + [prog])
                for t in ("a", "b", "c")]

    def first_round(self, jobs, nodes=("a", "b", "c"), nproc=2):
        """Waits until every worker of every node started in one round; returns that round."""
        world = nproc * len(nodes)

        def complete(recs):
            rounds = {r["round"] for r in recs if r["world"] == world}
            return any(ml.round_complete(recs, rn, nodes, nproc, world) for rn in rounds)

        self.wait_records(complete, 20, jobs, "a round of %d workers on %s" % (world, ",".join(nodes)))
        recs = self.records()
        return max(rn for rn in {r["round"] for r in recs} if ml.round_complete(recs, rn, nodes, nproc, world))

    # --- worker failure ------------------------------------------------------------------
    def test_worker_failure_on_one_node_restarts_all_nodes(self):
        port = ml.free_port()
        prog = self.recorder(fail_node="c", fail_local=1, fail_attempt=0, exit_code=5)
        # "a" hosts the endpoint; the failure happens on "c", a node that hosts nothing.
        a = self.agent("a", self.elastic_args(3, port, nproc=2, extra=["--max_restarts=1"]) + [prog])
        self.assertTrue(ml.wait_listening(port, proc=a.proc),
                        "agent a did not host the endpoint\n" + self.describe_all([a]))
        jobs = [a] + [self.agent(t, self.elastic_args(3, port, nproc=2, extra=["--max_restarts=1"]) + [prog])
                      for t in ("b", "c")]

        self.wait_records(lambda recs: sum(r["restart"] == 1 for r in recs) == 6, 25, jobs,
                          "every worker of every node to start attempt 1")
        self.release()
        results = self.wait_all(jobs, 20)
        for res in results:
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)

        recs = self.records()
        self.assertEqual(len(recs), 12, "expected 3 nodes x 2 workers x 2 attempts\n%s" % recs)
        for attempt in (0, 1):
            mine = [r for r in recs if r["restart"] == attempt]
            self.assertEqual(sorted((r["node"], r["local_rank"]) for r in mine),
                             [(n, lr) for n in ("a", "b", "c") for lr in (0, 1)], recs)
            self.assertEqual(len({r["round"] for r in mine}), 1,
                             "attempt %d ran in several rounds: %s" % (attempt, recs))
            self.assertEqual(sorted(r["rank"] for r in mine), list(range(6)), recs)
            self.assertEqual({r["world"] for r in mine}, {6}, recs)
        round0 = next(r["round"] for r in recs if r["restart"] == 0)
        round1 = next(r["round"] for r in recs if r["restart"] == 1)
        self.assertGreater(round1, round0, "the restart did not start a new round (fencing token): %s" % recs)
        # Nobody left: every node keeps its ranks.
        ranks = {}
        for r in recs:
            ranks.setdefault((r["node"], r["local_rank"]), set()).add(r["rank"])
        self.assertTrue(all(len(v) == 1 for v in ranks.values()), "ranks moved across the restart: %s" % recs)

    def test_budget_spent_ends_every_node_with_the_failed_workers_exit_code(self):
        port = ml.free_port()
        prog = self.recorder(fail_node="c", fail_local=1, fail_attempt=0, exit_code=7)
        jobs = self.start_three(3, port, prog=prog, extra=["--max_restarts=0"])
        self.first_round(jobs)
        # The other workers hold for 60 s unless their agents stop them: a safety timeout below that.
        results = self.wait_all(jobs, ml.SAFETY_TIMEOUT_S)
        # Every node exits with the job's first failure (one exit code for the scheduler), and the
        # others say which worker it was.
        for res in results:
            self.assertEqual(res.returncode, 7, "a node did not exit with the failed worker's code\n" +
                             self.describe_all(jobs))
            self.assert_no_crash_text(res.stderr, res)
        for res in results[:2]:
            self.assertRegex(res.stderr, r"job failed: worker rank \d+ on node \S+ failed with exit code 7",
                             res.describe())
        self.assertIn("fails in attempt 0", results[2].stderr, "the failing worker's stderr is not reported\n" +
                      results[2].describe())
        self.assert_no_leftovers(jobs)
        self.assertEqual({r["restart"] for r in self.records()}, {0}, "a restart happened with max_restarts=0")

    # --- a whole agent dies --------------------------------------------------------------
    def check_survivors_continue(self, embedded, sig=signal.SIGKILL):
        """Three agents, --nnodes=2:3; agent c (which hosts nothing) gets `sig`. The heartbeat
        timeout is 60 s, longer than the safety timeout: only the broken stream (or the leave)
        can tell the survivors in time."""
        port = ml.free_port()
        if embedded:
            prog = self.recorder()
            conf = "last_call_timeout=10,heartbeat_timeout=60"
            a = self.agent("a", self.elastic_args("2:3", port, nproc=2, conf=conf) + [prog])
            self.assertTrue(ml.wait_listening(port, proc=a.proc), "agent a did not host\n" + self.describe_all([a]))
            jobs = [a] + [self.agent(t, self.elastic_args("2:3", port, nproc=2, conf=conf) + [prog]) for t in "bc"]
        else:
            ml.Daemon(self, port)
            jobs = self.start_three("2:3", port, conf="is_host=0,last_call_timeout=10,heartbeat_timeout=60")
        round1 = self.first_round(jobs)

        victim = jobs[2]
        victim.kill(sig)  # the agent only, as a crash or an OOM kill would: not its process group
        self.wait_records(
            lambda recs: ml.round_complete(recs, max(ml.latest_round(recs, n) for n in "ab"), "ab", 2, 4)
            and all(ml.latest_round(recs, n) > round1 for n in "ab"),
            ml.SAFETY_TIMEOUT_S, jobs[:2],
            "the survivors' workers to restart in a round of 4 (the heartbeat timeout is 60 s: the server must "
            "notice the broken stream)")
        self.assertEqual(victim.wait(10).returncode, -9 if sig == signal.SIGKILL else 128 + sig)
        left = victim.survivors(grace=3.0)
        self.assertEqual(left, [], "workers of the stopped agent outlived it")

        recs = self.records()
        new = [r for r in recs if r["round"] > round1]
        self.assertEqual({r["node"] for r in new}, {"a", "b"}, recs)
        self.assertEqual(len({r["round"] for r in new}), 1, recs)
        self.assertEqual(sorted(r["rank"] for r in new), [0, 1, 2, 3], recs)
        self.assertEqual({(r["world"], r["group_world"]) for r in new}, {(4, 2)}, recs)
        self.assertEqual({r["restart"] for r in recs}, {0}, "a membership change spent the restart budget")

        self.release()
        for res in self.wait_all(jobs[:2], 15):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)

    def test_kill9_agent_survivors_continue_in_smaller_round(self):
        self.check_survivors_continue(embedded=False)

    def test_kill9_agent_survivors_continue_with_embedded_host(self):
        self.check_survivors_continue(embedded=True)

    def test_sigterm_agent_leaves_without_closing_the_job(self):
        # DESIGN: an agent stopped by a signal does not close the rendezvous for the others.
        self.check_survivors_continue(embedded=False, sig=signal.SIGTERM)

    def test_kill9_of_hosting_agent_fails_the_others_with_the_infrastructure_code(self):
        port = ml.free_port()
        prog = self.recorder()
        # heartbeat_timeout=2: the others try to join again for 2 x 2 s, then give up.
        conf = "last_call_timeout=10,heartbeat_timeout=2"
        host = self.agent("a", self.elastic_args("2:3", port, nproc=2, conf=conf) + [prog])
        self.assertTrue(ml.wait_listening(port, proc=host.proc), "agent a did not host\n" + self.describe_all([host]))
        jobs = [host] + [self.agent(t, self.elastic_args("2:3", port, nproc=2, conf=conf) + [prog]) for t in "bc"]
        round1 = self.first_round(jobs)
        host.kill()
        # Their workers hold for 60 s: agents that went on without the rendezvous miss the timeout.
        results = self.wait_all(jobs[1:], ml.SAFETY_TIMEOUT_S)
        for res in results:
            self.assertEqual(res.returncode, ml.EXIT_INFRASTRUCTURE,
                             "an agent that lost its rendezvous must exit with the infrastructure code\n" + self.describe_all(jobs))
            self.assertIn("rendezvous", res.stderr.lower(), "no clear error\n" + res.describe())
            self.assert_no_crash_text(res.stderr, res)
        self.assert_no_leftovers(jobs)
        self.assertEqual({r["round"] for r in self.records()}, {round1})

    def test_kill9_agent_below_min_nodes_fails_after_join_timeout_with_the_infrastructure_code(self):
        port = ml.free_port()
        ml.Daemon(self, port)
        jobs = self.start_three(3, port, conf="is_host=0,join_timeout=3")
        round1 = self.first_round(jobs)

        victim = jobs[2]
        killed_at = time.monotonic()
        victim.kill()
        # join_timeout=3 (the default is 600 s): survivors that kept waiting miss the safety timeout.
        results = self.wait_all(jobs[:2], ml.SAFETY_TIMEOUT_S)
        took = time.monotonic() - killed_at
        for res in results:
            self.assertEqual(res.returncode, ml.EXIT_INFRASTRUCTURE,
                             "survivors below --nnodes=3 must fail with the infrastructure code\n" + self.describe_all(jobs))
            self.assert_no_crash_text(res.stderr, res)
        self.assertGreater(took, 1.0, "survivors gave up at once instead of waiting for a replacement "
                           "(join_timeout=3)\n" + self.describe_all(jobs))
        self.assertEqual(victim.proc.wait(5), -9)
        self.assert_no_leftovers(jobs)
        recs = self.records()
        self.assertEqual({r["round"] for r in recs}, {round1}, "a round formed below min nodes: %s" % recs)


if __name__ == "__main__":
    main()
