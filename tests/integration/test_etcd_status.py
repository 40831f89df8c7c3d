"""`ddprun-rdzv status` and `ddprun --timeline` on the etcd backend (README "Status", "Job
timeline"): a 2-node job on a real 3-member etcd; status reads the job from etcd itself (the
driver's snapshot and each node's lease), and each agent's timeline holds the job's rounds and
its end, numbered by the job's events."""
import json
import subprocess
import time

import multinode_lib as ml
import unittest_main
from etcd_testlib import FLAKY, PREFIX, EtcdTestBase


class EtcdStatusTest(EtcdTestBase):

    def release(self):
        with open(self.path("release"), "w"):
            pass

    def status(self, *extra):
        cmd = [ml.RDZV, "status", "--rdzv_backend=etcd", "--rdzv_endpoint=%s" % ",".join(self.cluster.endpoints),
               "--rdzv_prefix=%s" % PREFIX, "--timeout=10"] + list(extra)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    def test_status_reads_an_etcd_job_and_timelines_hold_its_rounds(self):
        timelines = {t: self.path("timeline_%s.jsonl" % t) for t in "ab"}
        # The timeline through its PET_ variable, as a scheduler's environment would set it.
        jobs = [self.agent(t, "2", self.recorder(), env={"PET_TIMELINE": timelines[t]}) for t in "ab"]
        self.wait_records(lambda recs: len(recs) == 2, jobs, "round 1 on a and b")

        # Both nodes in the running round, each with its lease's time left.
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while True:
            r = self.status("--rdzv_id=%s" % self.run_id, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            job = json.loads(r.stdout)["jobs"][0]
            if job["phase"] == "running" and len(job["nodes"]) == 2:
                break
            self.assertLess(time.monotonic(), deadline, "status never showed the running round: %s" % r.stdout)
            time.sleep(0.1)
        self.assertEqual(json.loads(r.stdout)["server"], "etcd")
        self.assertEqual(job["run_id"], self.run_id)
        self.assertEqual(job["round"], 1)
        self.assertEqual(sorted(n["group_rank"] for n in job["nodes"]), [0, 1])
        self.assertEqual({n["state"] for n in job["nodes"]}, {"running"})
        for n in job["nodes"]:
            self.assertGreater(n["lease_left_ms"], 0, job)
        table = self.status("--rdzv_id=%s" % self.run_id)
        self.assertEqual(table.returncode, 0, table.stderr)
        for n in job["nodes"]:
            self.assertIn(n["node_id"], table.stdout)
        self.assertIn("lease", table.stdout)
        # A job etcd does not hold, and the id that etcd needs.
        missing = self.status("--rdzv_id=no_such_job")
        self.assertEqual(missing.returncode, 1, missing.stderr)
        self.assertIn("no job 'no_such_job'", missing.stderr)
        self.assertEqual(self.status().returncode, 2)

        self.release()
        for r in self.wait_all(jobs):
            self.assertEqual(r.returncode, 0, r.describe())
        node_ids = {n["node_id"] for n in job["nodes"]}
        for tag, path in timelines.items():
            with open(path) as f:
                events = [json.loads(line) for line in f]
            kinds = [e["event"] for e in events]
            self.assertEqual(kinds[0], "joining", events)
            self.assertIn("round_formed", kinds, events)
            self.assertEqual(kinds[-1], "job_ended", events)
            self.assertEqual(events[-1]["exit_status"], 0)
            formed = events[kinds.index("round_formed")]
            self.assertEqual(sorted(formed["members"]), sorted(node_ids))
            self.assertIn(events[-1]["node"], node_ids)
            # Ordered by the job's event numbers, which the etcd driver's notices carry.
            seqs = [e["seq"] for e in events]
            self.assertEqual(seqs, sorted(seqs), events)
            self.assertGreater(formed["seq"], 0, events)

    def test_status_shows_the_last_failure_from_etcd(self):
        # Node a's worker fails in attempt 0 (exit 3); the job restarts once. The driver's snapshot
        # in etcd carries the failure and the event count, whichever node reads it.
        flaky = self.script("flaky.sh", FLAKY % {"d": self.tmp, "fail_until": 1})
        jobs = [self.agent(t, "2", [flaky], conf="heartbeat_timeout=4", env={"PET_MAX_RESTARTS": "1"}) for t in "ab"]
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while True:
            r = self.status("--rdzv_id=%s" % self.run_id, "--json")
            self.assertIn(r.returncode, (0, 1), r.stderr)  # 1: no key of the job yet, at its start
            job = json.loads(r.stdout)["jobs"][0] if r.returncode == 0 else {}
            if job.get("last_failure") and job["round"] >= 2:
                break
            self.assertLess(time.monotonic(), deadline, "status never showed the failure: %s" % r.stdout)
            time.sleep(0.1)
        f = job["last_failure"]
        self.assertEqual((f["kind"], f["cause"], f["exit_code"], f["round"]), ("worker_failed", "worker_exit", 3, 1), f)
        self.assertIsNone(f["age_ms"], f)  # the driver's clock is not the reader's
        self.assertGreaterEqual(job["events"], f["seq"], job)
        self.assertEqual(job["restarts"], 1, job)
        with open(self.path("release"), "w"):
            pass
        for res in self.wait_all(jobs):
            self.assertEqual(res.returncode, 0, res.describe())


if __name__ == "__main__":
    unittest_main.main()
