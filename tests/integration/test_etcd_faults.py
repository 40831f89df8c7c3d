"""--rdzv_backend=etcd under faults: the etcd leader killed, a node or the driving node killed, a
frozen agent fenced, every agent dead (etcd_testlib). docs/etcd.md."""
import json
import os
import signal
import time

import ddprun_testlib as tl
import multinode_lib as ml
import unittest_main
from etcd_testlib import PREFIX, STORE_EXCHANGE, EtcdTestBase


class EtcdFaultsTest(EtcdTestBase):
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


if __name__ == "__main__":
    unittest_main.main()
