"""--recovery=in_process when a machine vanishes: three hosts made of Linux network namespaces
(netns_lib: 192.0.2.0/24 on a bridge), real ddprun agents, real torch (PYTHON_EXEC) and gloo
between the hosts, examples/torch/recoverable_ddp.py.

Hosts a and b run the job (2 ranks each, elastic --nnodes=2:2, the rendezvous on a); c joins once
the job runs and stands by. Then b's bridge port goes down: no FIN, no RST, only silence, as when
a machine loses power. Unlike test_in_process_recovery_multinode (whose lost node's sockets close
at once), a's ranks are left blocked in a collective on peers that say nothing:
- the rendezvous drops b after heartbeat_timeout and forms the next round with c;
- a's agent keeps its workers and tells them the round; they leave the blocked collective at the
  process group's timeout (the script's --timeout_s: torch's gloo cannot be interrupted sooner);
- c's ranks start in b's place and take their state from a's;
- b, cut off, cannot reach its rendezvous: it stops its workers and fails by itself.
Asserted: a's ranks kept their processes, the job's exit status on a and c, b's own exit and no
process of it left, and the final digest against the same job without a failure (on loopback: the
parameters depend only on the world and the rank positions).

Every namespace is deleted at the end, also on failure. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN);
where namespaces cannot be created it FAILS, as test_netns does.
"""

import os
import time

import ddprun_testlib as tl
import multinode_lib as ml
import recovery_lib
from ddprun_testlib import main
from netns_lib import make_test_hosts

EXAMPLE = os.path.join(tl.REPO, "examples", "torch", "recoverable_ddp.py")
STEPS = 60
NPROC = 2
GROUP_TIMEOUT_S = 10  # how long a's ranks stay blocked on the silent peers
TIMEOUT = 300  # safety only


class InProcessRecoveryNetnsTest(ml.MultiNodeTestCase):

    def env(self, extra=None):
        e = {"PYTHONPATH": os.path.join(tl.REPO, "python"), "RECOVERABLE_PIDS": self.path("pids.txt"),
             "OMP_NUM_THREADS": "1"}
        e.update(extra or {})
        return e

    def script_args(self, step_ms):
        return [EXAMPLE, "--steps", str(STEPS), "--step_ms", str(step_ms), "--timeout_s", str(GROUP_TIMEOUT_S),
                "--notice_timeout_s", "120"]

    def expected_digest(self):
        """The same job without a failure, 2 nodes of 2 ranks on loopback."""
        port = ml.free_port()
        args = lambda r: (["--nnodes=2", "--node_rank=%d" % r, "--master_addr=127.0.0.1", "--master_port=%d" % port,
                           "--nproc_per_node=%d" % NPROC, "--shutdown_timeout=2", "--max_restarts=0"] +
                          self.script_args(0))
        env = self.env({"RECOVERABLE_PIDS": self.path("baseline_pids.txt")})
        jobs = [self.agent("n0", args(0), env=env), self.agent("n1", args(1), env=env)]
        results = self.wait_all(jobs, TIMEOUT)
        for r in results:
            self.assertEqual(r.returncode, 0, self.describe_all(jobs))
        want = recovery_lib.last_digest(results[0].stdout)
        self.assertIsNotNone(want, self.describe_all(jobs))
        return want

    def test_a_host_that_goes_silent_is_replaced_by_a_standby_and_the_others_keep_their_processes(self):
        want = self.expected_digest()
        h = make_test_hosts(self, ["a", "b", "c"])
        port = ml.free_port()  # any port: the namespaces are fresh
        conf = "heartbeat_timeout=2,last_call_timeout=1"
        args = self.elastic_args("2:2", port, nproc=NPROC, conf=conf, host=h.addr["a"],
                                 extra=["--recovery=in_process", "--max_restarts=2", "--log_level=info"]) + \
            self.script_args(step_ms=300)
        agents = {}

        def start(t):
            # gloo between the hosts: each rank's address is its host's veth, not the loopback that
            # the machine's hostname resolves to.
            agents[t] = self.agent(t, args, env=self.env({"GLOO_SOCKET_IFNAME": h.host_if[t]}),
                                   prefix=h.exec_prefix(t))

        start("a")  # first: it owns 192.0.2.1, so it hosts the rendezvous
        deadline = time.monotonic() + TIMEOUT
        while "joined" not in agents["a"].stderr() and time.monotonic() < deadline:  # a joined first: rank 0
            self.assertIsNone(agents["a"].poll(), agents["a"].result(agents["a"].poll()).describe())
            time.sleep(0.05)
        start("b")
        jobs = [agents["a"], agents["b"]]
        while "step 2\n" not in agents["a"].stdout() and time.monotonic() < deadline:  # rank 0 is a's
            self.assertIsNone(agents["a"].poll(), self.describe_all(jobs))
            time.sleep(0.1)
        start("c")  # the round is full: c stands by
        jobs.append(agents["c"])
        while agents["a"].stderr().count("joined") < 3 and time.monotonic() < deadline:
            self.assertIsNone(agents["c"].poll(), self.describe_all(jobs))
            time.sleep(0.1)
        before = {rank: pid for rank, pid, _ in recovery_lib.read_starts(self.path("pids.txt"))}
        self.assertEqual(sorted(before), [0, 1, 2, 3], before)

        h.cut("b")
        res_a, res_c = self.wait_all([agents["a"], agents["c"]], TIMEOUT)
        self.assertEqual(res_a.returncode, 0, self.describe_all(jobs))
        self.assertEqual(res_c.returncode, 0, self.describe_all(jobs))
        self.assertRegex(res_a.stderr, r"interrupted \(node \S+ left: no heartbeat for 2\.0s\): recovering in process",
                         self.describe_all(jobs))
        self.assertIn("live rank(s) here told round", res_a.stderr)
        self.assertEqual(recovery_lib.last_digest(res_a.stdout), want, self.describe_all(jobs))
        starts = recovery_lib.read_starts(self.path("pids.txt"))
        for rank in (0, 1):  # a's ranks: the same processes from start to end
            self.assertEqual([pid for r, pid, _ in starts if r == rank], [before[rank]], starts)
        for rank in (2, 3):  # b's ranks: started again, on c
            self.assertEqual(len([pid for r, pid, _ in starts if r == rank]), 2, starts)

        # The cut-off host cannot reach its rendezvous: it stops its workers and fails by itself.
        res_b = agents["b"].wait(ml.SAFETY_TIMEOUT_S)
        self.assertEqual(res_b.returncode, ml.EXIT_INFRASTRUCTURE, res_b.describe())
        self.assertEqual(agents["b"].survivors(grace=3.0), [], "workers of the cut-off host kept running")
        self.assert_no_leftovers(jobs)


if __name__ == "__main__":
    main()
