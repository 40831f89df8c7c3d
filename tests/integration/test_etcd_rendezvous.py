"""--rdzv_backend=etcd end to end: real ddprun agents on a real 3-member etcd 3.4 cluster
(scripts/etcd_cluster.py), as users run them. docs/etcd.md."""
import json
import os
import re
import signal
import sys
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
import ddprun_testlib as tl  # noqa: E402
import multinode_lib as ml  # noqa: E402
import unittest_main  # noqa: E402
from etcd_cluster import EtcdCluster, etcd_available  # noqa: E402

TEST_BIN = os.environ.get("DDPRUN_TEST_BIN") or os.path.join(tl.REPO, "build", "test-bin")
STORE_EXCHANGE = os.path.join(TEST_BIN, "store_exchange")
PREFIX = "/ddprun-test"

# Records one line per worker start, then waits for the test's release file (or exits at once).
RECORD = r"""#!/bin/sh
echo "$NODE_TAG $DDPRUN_ROUND $RANK $WORLD_SIZE $GROUP_RANK $TORCHELASTIC_RESTART_COUNT" >> "%(d)s/rec_$$"
while [ ! -e "%(d)s/release" ]; do sleep 0.05; done
exit "${EXIT_CODE:-0}"
"""


class EtcdTestBase(tl.DdprunTestCase):
    """A fresh cluster per test, and agents of this test's job on it."""
    TLS = False

    def setUp(self):
        super().setUp()
        reason = etcd_available()
        if reason:
            self.skipTest(reason)
        self.cluster = EtcdCluster(size=3, tls=self.TLS)
        self.cluster.start()
        self.addCleanup(self.cluster.close)
        self.run_id = "etcd_%s" % uuid.uuid4().hex[:8]

    def agent(self, tag, nnodes, program, nproc=1, backend="etcd", conf="heartbeat_timeout=2", env=None):
        args = ["--nnodes=%s" % nnodes, "--nproc_per_node=%d" % nproc, "--rdzv_backend=%s" % backend,
                "--rdzv_endpoint=%s" % ",".join(self.cluster.endpoints), "--rdzv_id=%s" % self.run_id,
                "--local_addr=127.0.0.1", "--shutdown_timeout=2",
                "--rdzv_conf=%s,etcd_prefix=%s" % (conf, PREFIX), "--no_python"] + list(program)
        e = ml.clean_env({"NODE_TAG": tag})
        e.update(env or {})
        return ml.Proc(self, [tl.DDPRUN] + args, env=e, name="agent_" + tag)

    def wait_all(self, jobs, timeout=ml.SAFETY_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        return [j.wait(max(0.1, deadline - time.monotonic())) for j in jobs]

    def records(self):
        out = []
        for name in os.listdir(self.tmp):
            if name.startswith("rec_"):
                with open(self.path(name)) as f:
                    out += [line.split() for line in f if len(line.split()) == 6]
        return out

    def wait_records(self, predicate, jobs, what):
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while not predicate(self.records()):
            for j in jobs:
                if j.poll() is not None:
                    self.fail("an agent exited (%s) while waiting for %s\n%s" % (j.poll(), what, j.result(j.poll()).describe()))
            if time.monotonic() > deadline:
                self.fail("no %s within the safety bound; records %s\n%s" % (
                    what, self.records(), "\n".join(j.result(j.poll()).describe() for j in jobs)))
            time.sleep(0.02)

    def recorder(self):
        return [self.script("record.sh", RECORD % {"d": self.tmp})]

    def assert_job_keys_gone(self):
        self.assertEqual(self.cluster.keys(PREFIX + "/"), [], "the job left keys in etcd")



class EtcdRendezvousTest(EtcdTestBase):
    def test_two_nodes_form_a_round_and_exit_0(self):
        program = ["/bin/sh", "-c", "echo rank=$RANK world=$WORLD_SIZE round=$DDPRUN_ROUND store=$DDPRUN_STORE_ADDR"]
        jobs = [self.agent(t, "2", program) for t in ("a", "b")]
        results = self.wait_all(jobs)
        for r in results:
            self.assertEqual(r.returncode, 0, r.describe())
            self.assertIn("world=2 round=1 store=etcd://", r.stdout)
        ranks = sorted(int(re.search(r"rank=(\d)", r.stdout).group(1)) for r in results)
        self.assertEqual(ranks, [0, 1])
        self.assert_job_keys_gone()

    def test_etcd_v2_name_and_workers_agree_through_the_store_on_etcd(self):
        if not os.access(STORE_EXCHANGE, os.X_OK):
            self.fail("%s not built (ninja store_exchange)" % STORE_EXCHANGE)
        jobs = [self.agent(t, "2", [STORE_EXCHANGE], nproc=2, backend="etcd-v2") for t in ("a", "b")]
        results = self.wait_all(jobs)
        lines = []
        for r in results:
            self.assertEqual(r.returncode, 0, r.describe())
            lines += re.findall(r"rank (\d): arrived=(\d+) leader=(\d)", r.stdout)
        self.assertEqual(sorted(int(rank) for rank, _, _ in lines), [0, 1, 2, 3])
        self.assertEqual({arrived for _, arrived, _ in lines}, {"4"})  # every add counted once
        self.assertEqual(len({leader for _, _, leader in lines}), 1)    # one compare_set winner for all
        self.assert_job_keys_gone()

    def test_a_job_forms_and_ends_while_an_etcd_member_is_frozen(self):
        # A frozen member accepts connections and answers nothing: agents that start on it move
        # on at their call deadline. Four agents, so that some start there (a random member each).
        follower = [i for i in range(3) if i != self.cluster.leader()][0]
        self.cluster.stop(follower)
        self.addCleanup(lambda: self.cluster.cont(follower))
        program = ["/bin/sh", "-c", "echo rank=$RANK"]
        jobs = [self.agent(t, "4", program) for t in ("a", "b", "c", "d")]
        results = self.wait_all(jobs)
        for r in results:
            self.assertEqual(r.returncode, 0, r.describe())
        ranks = sorted(int(re.search(r"rank=(\d)", r.stdout).group(1)) for r in results)
        self.assertEqual(ranks, [0, 1, 2, 3])
        self.assert_job_keys_gone()

    def test_a_worker_failure_ends_the_job_with_its_exit_code_on_every_node(self):
        jobs = [self.agent("a", "2", self.recorder(), env={"EXIT_CODE": "3"}),
                self.agent("b", "2", self.recorder())]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on both nodes")
        with open(self.path("release"), "w"):
            pass
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 3, r.describe())
        self.assert_job_keys_gone()

    def test_the_job_survives_killing_the_etcd_leader_mid_round(self):
        # Lease renewals must reach a new etcd leader within 5H/8 (the agent fences itself after
        # that): H = 4 s leaves 2.5 s for the election (500 ms timeout here) on a loaded machine;
        # with H = 2 s (1.25 s) a run under load fenced (docs/etcd.md).
        jobs = [self.agent(t, "2", self.recorder(), conf="heartbeat_timeout=4") for t in ("a", "b")]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on both nodes")
        self.cluster.kill(self.cluster.leader())  # a minority of etcd lost while the round runs
        time.sleep(5)  # past the heartbeat timeout (4 s): lease renewals must have moved on
        with open(self.path("release"), "w"):
            pass
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
        self.assertEqual({rec[1] for rec in self.records()}, {"1"}, "the round was restarted: a node was lost")
        self.assert_job_keys_gone()

    def test_torch_ddp_trains_on_while_the_etcd_leader_is_killed(self):
        # The bar: a job of the unmodified torch DDP script (gloo, env://) survives the loss
        # of the etcd leader mid-training, with no restart.
        out = self.path("model.pt")
        script = os.path.join(tl.REPO, "examples", "torch", "ddp_train.py")
        program = [tl.PYTHON_EXEC, "-u", script, "--out", out, "--epochs", "300"]
        jobs = [self.agent(t, "2", program, conf="heartbeat_timeout=4") for t in ("a", "b")]
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while "epoch 5 " not in jobs[0].stdout() + jobs[1].stdout():
            for j in jobs:
                if j.poll() is not None:
                    self.fail("an agent ended before training got going\n%s" % j.result(j.poll()).describe())
            self.assertLess(time.monotonic(), deadline, "no training progress within the safety bound")
            time.sleep(0.05)
        self.cluster.kill(self.cluster.leader())
        killed_at = jobs[0].stdout() + jobs[1].stdout()
        self.assertNotIn("epoch 299 ", killed_at, "training ended before the kill: raise --epochs")
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
        with open(out + ".json") as f:
            summary = json.load(f)
        self.assertEqual((summary["world_size"], int(summary["restart_count"])), (2, 0), summary)
        self.assert_job_keys_gone()

    def test_a_node_killed_mid_round_is_dropped_by_its_lease_and_the_survivor_goes_on(self):
        self._kill_one_mid_round(kill_driver=False)

    def test_the_driving_node_killed_mid_round_is_taken_over_and_the_survivor_goes_on(self):
        # The survivor is elected, restores the lost driver's state (round 1, its members) and
        # runs round 2, not a second round 1: round numbers stay fencing tokens.
        self._kill_one_mid_round(kill_driver=True)

    def test_a_node_with_other_rules_is_refused_with_exit_2_naming_the_difference(self):
        first = self.agent("a", "2", self.recorder())
        key = "%s/run/%s/rdzv/driver" % (PREFIX, self.run_id)
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while self.cluster.get(key) is None:  # "a" drives, so the job's rules are its own
            self.assertIsNone(first.poll(), first.result(first.poll()).describe())
            self.assertLess(time.monotonic(), deadline, "no driver within the safety bound")
            time.sleep(0.02)
        other = self.agent("b", "3", self.recorder())
        r = other.wait(ml.SAFETY_TIMEOUT_S)
        self.assertEqual(r.returncode, 2, r.describe())
        self.assertIn("nnodes 3..3 here, 2..2 in the job", r.stderr + r.stdout)
        self.assertIsNone(first.poll(), "the job's own node must not be affected")

    def test_a_frozen_agent_is_fenced_by_its_watchdog_before_the_others_go_on(self):
        # The agent is SIGSTOPped: it cannot renew its lease nor stop its workers. Its watchdog
        # kills them at 13H/16 after the last renewal, before etcd expires the lease (>= H) and
        # the driver starts round 2 without it (docs/etcd.md, docs/rendezvous.md "Fencing").
        if not os.access(os.path.join(tl.BIN_DIR, "ddprun-watchdog"), os.X_OK):
            self.fail("ddprun-watchdog not built (ninja ddprun-watchdog)")
        jobs = [self.agent(t, "1:2", self.recorder()) for t in ("a", "b")]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on both nodes")
        driver = self.cluster.get("%s/run/%s/rdzv/driver" % (PREFIX, self.run_id))
        driving = jobs[0] if jobs[0].pid == int(driver.split(":")[1]) else jobs[1]
        frozen = jobs[1] if driving is jobs[0] else jobs[0]
        frozen_tag = "b" if frozen is jobs[1] else "a"
        worker_pid = [pid for pid, rec in self.records_by_pid().items() if rec[0] == frozen_tag][0]
        os.kill(frozen.pid, signal.SIGSTOP)
        self.addCleanup(lambda: frozen.kill(signal.SIGCONT))
        self.wait_records(lambda recs: any(r[1] == "2" and r[3] == "1" for r in recs), [driving],
                          "round 2 with the other node alone")
        self.assertIn(tl._proc_state(worker_pid), (None, "Z"),
                      "the frozen node's worker of round 1 was alive when round 2 started")
        with open(self.path("release"), "w"):
            pass
        self.assertEqual(driving.wait(ml.SAFETY_TIMEOUT_S).returncode, 0)

    def test_a_frozen_agent_that_thaws_is_fenced_and_joins_again_as_a_newcomer(self):
        # Frozen past its lease: the other node runs round 2 alone. Thawed, the node finds its
        # lease gone, fences, joins again, and both run round 3 (docs/etcd.md; the gRPC
        # backend's rule, docs/rendezvous.md "Fencing").
        jobs = [self.agent(t, "1:2", self.recorder()) for t in ("a", "b")]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on both nodes")
        driver = self.cluster.get("%s/run/%s/rdzv/driver" % (PREFIX, self.run_id))
        driving = jobs[0] if jobs[0].pid == int(driver.split(":")[1]) else jobs[1]
        frozen = jobs[1] if driving is jobs[0] else jobs[0]
        os.kill(frozen.pid, signal.SIGSTOP)
        self.addCleanup(lambda: frozen.kill(signal.SIGCONT))
        self.wait_records(lambda recs: any(r[1] == "2" and r[3] == "1" for r in recs), [driving],
                          "round 2 with the other node alone")
        os.kill(frozen.pid, signal.SIGCONT)
        self.wait_records(lambda recs: len([r for r in recs if r[1] == "3" and r[3] == "2"]) == 2, jobs,
                          "round 3 with both nodes")
        with open(self.path("release"), "w"):
            pass
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
        self.assert_job_keys_gone()

    def test_when_every_agent_dies_the_job_keys_expire_with_their_leases(self):
        # Workers wrote store keys; then every agent is SIGKILLed (no cleanup runs). The node
        # leases (2 s) and the job lease (4 s), which the store keys live on, expire: nothing of
        # the job stays in etcd.
        if not os.access(STORE_EXCHANGE, os.X_OK):
            self.fail("%s not built (ninja store_exchange)" % STORE_EXCHANGE)
        hold = self.path("hold")
        jobs = [self.agent(t, "2", [STORE_EXCHANGE], env={"STORE_EXCHANGE_HOLD": hold}) for t in ("a", "b")]
        job_prefix = "%s/run/%s/" % (PREFIX, self.run_id)
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while not any("/kv/rank/1" in k for k in self.cluster.keys(job_prefix)):
            self.assertLess(time.monotonic(), deadline, "no store keys within the safety bound")
            time.sleep(0.05)
        for j in jobs:
            j.kill(signal.SIGKILL)
            j.wait(ml.SAFETY_TIMEOUT_S)
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while self.cluster.keys(job_prefix):
            self.assertLess(time.monotonic(), deadline, "keys left after every agent died: %s" % self.cluster.keys(job_prefix))
            time.sleep(0.1)
        with open(hold, "w"):
            pass

    def records_by_pid(self):
        out = {}
        for name in os.listdir(self.tmp):
            if name.startswith("rec_"):
                with open(self.path(name)) as f:
                    lines = [line.split() for line in f if len(line.split()) == 6]
                if lines:
                    out[int(name[4:])] = lines[0]
        return out

    def _kill_one_mid_round(self, kill_driver):
        jobs = [self.agent(t, "1:2", self.recorder()) for t in ("a", "b")]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on both nodes")
        driver = self.cluster.get("%s/run/%s/rdzv/driver" % (PREFIX, self.run_id))
        self.assertIsNotNone(driver)
        driver_pid = int(driver.split(":")[1])
        driving = jobs[0] if jobs[0].pid == driver_pid else jobs[1]
        other = jobs[1] if driving is jobs[0] else jobs[0]
        victim, survivor = (driving, other) if kill_driver else (other, driving)
        victim.kill(signal.SIGKILL)
        victim.wait(ml.SAFETY_TIMEOUT_S)
        # etcd expires the victim's lease (2 s); the driver restarts the survivor into round 2 alone.
        self.wait_records(lambda recs: any(r[1] == "2" and r[3] == "1" for r in recs), [survivor],
                          "round 2 with the survivor alone")
        with open(self.path("release"), "w"):
            pass
        self.assertEqual(survivor.wait(ml.SAFETY_TIMEOUT_S).returncode, 0)
        self.assertEqual(self.cluster.keys("%s/run/%s/rdzv/nodes/" % (PREFIX, self.run_id)), [])


class EtcdTlsTest(EtcdTestBase):
    """The same backend on a cluster that only speaks TLS with client certificates."""
    TLS = True

    def tls_conf(self):
        c = self.cluster.certs
        return "heartbeat_timeout=2,protocol=https,cacert=%s,cert=%s,key=%s" % (c["ca"], c["client_cert"], c["client_key"])

    def test_two_nodes_over_tls_agree_through_the_store_and_exit_0(self):
        if not os.access(STORE_EXCHANGE, os.X_OK):
            self.fail("%s not built (ninja store_exchange)" % STORE_EXCHANGE)
        jobs = [self.agent(t, "2", [STORE_EXCHANGE], nproc=2, conf=self.tls_conf()) for t in ("a", "b")]
        lines = []
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
            lines += re.findall(r"rank (\d): arrived=(\d+) leader=(\d)", r.stdout)
        self.assertEqual(sorted(int(rank) for rank, _, _ in lines), [0, 1, 2, 3])
        self.assertEqual({arrived for _, arrived, _ in lines}, {"4"})
        self.assert_job_keys_gone()

    def test_without_the_client_certificate_the_agent_cannot_join(self):
        # Plain HTTP against a TLS-only cluster: the agent fails as for an unreachable rendezvous.
        job = self.agent("a", "1", ["/bin/true"], conf="heartbeat_timeout=2")
        r = job.wait(ml.SAFETY_TIMEOUT_S + 30)
        self.assertEqual(r.returncode, ml.EXIT_INFRASTRUCTURE, r.describe())
        self.assertIn("cannot join the rendezvous on etcd", r.stderr + r.stdout)


# Fails with exit 3 on node a while TORCHELASTIC_RESTART_COUNT is below FAIL_UNTIL; records every
# start (node, restart count) first.
FLAKY = r"""#!/bin/sh
echo "$NODE_TAG $TORCHELASTIC_RESTART_COUNT" >> "%(d)s/starts"
if [ "$NODE_TAG" = a ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt %(fail_until)d ]; then exit 3; fi
while [ ! -e "%(d)s/release" ]; do sleep 0.05; done
"""


class EtcdJobsTest(EtcdTestBase):
    """The rest of the issue's list: budgets, scale-up, two jobs, every member gone, 4 torch nodes."""

    def release(self):
        with open(self.path("release"), "w"):
            pass

    def starts(self):
        try:
            with open(self.path("starts")) as f:
                return [tuple(line.split()) for line in f if len(line.split()) == 2]
        except FileNotFoundError:
            return []

    def test_the_restart_budget_is_one_for_the_job_not_one_per_node(self):
        # --max_restarts=1: node a's worker fails in attempt 0, the job restarts once (both nodes,
        # TORCHELASTIC_RESTART_COUNT=1 on both) and succeeds.
        flaky = self.script("flaky.sh", FLAKY % {"d": self.tmp, "fail_until": 1})
        jobs = [self.agent(t, "2", [flaky], conf="heartbeat_timeout=4") for t in ("a", "b")]
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while sorted(self.starts()).count(("b", "1")) < 1 or ("a", "1") not in self.starts():
            self.assertLess(time.monotonic(), deadline, "no second attempt on both nodes: %s" % self.starts())
            time.sleep(0.05)
        self.release()
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
        # b's first worker may be stopped before it writes its line (a's fails at once), so b's
        # attempt 0 is optional; the rest is exact: one restart for the job, on both nodes.
        starts = set(self.starts())
        self.assertTrue({("a", "0"), ("a", "1"), ("b", "1")} <= starts <= {("a", "0"), ("a", "1"), ("b", "0"), ("b", "1")},
                        "attempts: %s" % sorted(starts))

    def test_a_spent_budget_ends_the_job_on_every_node_with_the_failure(self):
        # Node a fails in every attempt: after the one restart of the job (not one per node) every
        # node exits with the worker's status, 3.
        flaky = self.script("flaky.sh", FLAKY % {"d": self.tmp, "fail_until": 99})
        jobs = [self.agent(t, "2", [flaky], conf="heartbeat_timeout=4") for t in ("a", "b")]
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 3, r.describe())
        counts = {c for _, c in self.starts()}
        self.assertEqual(counts, {"0", "1"}, "attempts: %s" % self.starts())

    def agent(self, tag, nnodes, program, nproc=1, backend="etcd", conf="heartbeat_timeout=2", env=None):
        e = {"PET_MAX_RESTARTS": "1"}
        e.update(env or {})
        return super().agent(tag, nnodes, program, nproc, backend, conf, e)

    def test_a_node_that_arrives_later_scales_the_job_up_without_spending_a_restart(self):
        jobs = [self.agent(t, "2:3", self.recorder(), conf="heartbeat_timeout=4,last_call_timeout=0.5") for t in "ab"]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on a and b")
        jobs.append(self.agent("c", "2:3", self.recorder(), conf="heartbeat_timeout=4,last_call_timeout=0.5"))
        # records: tag, round, rank, world, group rank, restart count
        self.wait_records(lambda recs: len([r for r in recs if r[3] == "3"]) == 3, jobs, "a round of 3 nodes")
        self.release()
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
        later = [r for r in self.records() if r[3] == "3"]
        self.assertEqual({r[5] for r in later}, {"0"}, "a membership change spent a restart: %s" % later)
        self.assertEqual(sorted(r[2] for r in later), ["0", "1", "2"])

    def test_a_scale_up_round_starts_only_after_the_old_workers_are_gone_on_every_node(self):
        # The hand-over (docs/rendezvous.md) through etcd: a's and b's workers outlive SIGTERM by
        # 1 s; c, joining, has none to stop, and its first workers must wait for theirs.
        import chaos_lib as cl
        life = self.write_file("life.py", cl.LIFE_WORKER)
        conf = "heartbeat_timeout=4,last_call_timeout=0.5"
        def program(grace):
            return [sys.executable, life, self.tmp, "60", str(grace)]
        jobs = [self.agent(t, "2:3", program(1.0), conf=conf) for t in "ab"]
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while {lv["node"] for lv in cl.read_lives(self.tmp)} != {"a", "b"}:
            self.assertLess(time.monotonic(), deadline, "no round on a and b")
            time.sleep(0.05)
        jobs.append(self.agent("c", "2:3", program(0), conf=conf))
        while not any(lv["node"] == "c" for lv in cl.read_lives(self.tmp)):
            self.assertLess(time.monotonic(), deadline, "c never ran a worker")
            time.sleep(0.05)
        self.release()
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
        lives = cl.check_lives(self, self.tmp)
        self.assertEqual({lv["world"] for lv in lives if lv["node"] == "c"}, {3})

    def test_a_job_goes_on_when_its_watches_resume_past_a_compaction(self):
        # Each member in turn is frozen while the cluster is compacted: every agent's watches
        # (its notices; the driver's; the election's) that were on it move to another member and
        # find the revision they resume from compacted away. They read again and go on; a third
        # node then joins and every node runs the new round. Before, an agent whose notices watch
        # hit a compaction failed with "lost the rendezvous on etcd ... was compacted" (exit 200).
        # Leases of 8 s: a 3 s freeze of the leader on a loaded machine must not expire them (that
        # is another test's business); here only the compaction matters.
        conf = "heartbeat_timeout=8,last_call_timeout=0.5"
        jobs = [self.agent(t, "2:3", self.recorder(), conf=conf) for t in "ab"]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on a and b")
        for member in range(3):
            self.cluster.stop(member)
            try:
                self.cluster.compact()
                time.sleep(3)  # the watch probe gives up on a silent member after 2 s
            finally:
                self.cluster.cont(member)
        said = jobs[0].stderr() + jobs[1].stderr()
        self.assertIn("was compacted", said, "no watch met the compaction: the test proved nothing\n" + said)
        jobs.append(self.agent("c", "2:3", self.recorder(), conf=conf))
        self.wait_records(lambda recs: len([r for r in recs if r[3] == "3"]) == 3, jobs, "a round of 3 nodes")
        self.release()
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())

    def test_a_job_whose_etcd_lease_is_gone_ends_every_node_with_200(self):
        # The job's lease holds its rendezvous state and notices; when it is gone (every agent cut
        # off from etcd for its TTL; here revoked), so is the job. Seen under load: the agents then
        # waited for good for notices no driver could write ("requested lease not found").
        jobs = [self.agent(t, "2", self.recorder(), conf="heartbeat_timeout=4") for t in "ab"]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on a and b")
        lease = self.cluster.get("%s/run/%s/rdzv/joblease" % (PREFIX, self.run_id))
        self.assertIsNotNone(lease, "no job lease key")
        self.cluster.revoke_lease(lease)
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, ml.EXIT_INFRASTRUCTURE, r.describe())
            self.assertIn("the job's etcd lease expired", r.stderr, r.describe())
        for j in jobs:
            self.assertEqual(j.survivors(), [], "processes outlived the agent")

    def test_two_jobs_with_different_run_ids_share_one_etcd(self):
        other = EtcdTestBase.agent  # the same agent, another run id
        first = [self.agent(t, "2", self.recorder()) for t in "ab"]
        saved, self.run_id = self.run_id, self.run_id + "_second"
        second = [other(self, t, "2", self.recorder()) for t in "cd"]
        self.run_id = saved
        self.wait_records(lambda recs: len(recs) == 4, first + second, "both jobs' rounds")
        self.release()
        for r in self.wait_all(first + second):
            self.assertEqual(r.returncode, 0, r.describe())
        by_job = {}
        for tag, rnd, rank, world, group, restarts in self.records():
            by_job.setdefault(tag in "ab", []).append((rank, world))
        self.assertEqual(sorted(by_job[True]), [("0", "2"), ("1", "2")])
        self.assertEqual(sorted(by_job[False]), [("0", "2"), ("1", "2")])

    def test_every_etcd_member_gone_ends_every_agent_with_200_and_nothing_left(self):
        jobs = [self.agent(t, "2", self.recorder()) for t in "ab"]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on both nodes")
        for i in range(self.cluster.size):
            self.cluster.stop(i)  # SIGSTOP: silent, not refusing (the harder case)
        try:
            for r in self.wait_all(jobs):
                self.assertEqual(r.returncode, ml.EXIT_INFRASTRUCTURE, r.describe())
            for j in jobs:
                self.assertEqual(j.survivors(), [], "workers outlived their agent")
        finally:
            for i in range(self.cluster.size):
                self.cluster.cont(i)

    def test_four_nodes_train_the_torch_ddp_script(self):
        out = self.path("model.pt")
        script = os.path.join(tl.REPO, "examples", "torch", "ddp_train.py")
        program = [tl.PYTHON_EXEC, "-u", script, "--out", out, "--epochs", "2"]
        jobs = [self.agent(t, "4", program, conf="heartbeat_timeout=5") for t in "abcd"]
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
        with open(out + ".json") as f:
            self.assertEqual(json.load(f)["world_size"], 4)
        self.assert_job_keys_gone()


if __name__ == "__main__":
    unittest_main.main()
