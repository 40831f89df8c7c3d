"""Store history under client crashes: no acknowledged write lost while the server lives.

A 1-node job on ddprun-rdzv holds a round open (its worker writes its environment to a file and
waits). CLIENTS store clients (tests/chaos/workers/store_history_client.cc) run with that worker's
environment, i.e. in the job's current round, and cycle through set, add and compare_set on shared
keys; each logs a call only after the server acknowledged it. For CHAOS_S seconds the test
SIGKILLs a random running client every 100-400 ms and starts a new incarnation in its place (a
client that already finished its calls is replaced without a kill; a kill needs a client still
running, so OPS is large enough that one runs for a good part of a second even on a quiet machine). Then it reads
the store back and checks the history:
  - every acknowledged set is there with its value;
  - the counter holds exactly the acknowledged adds, plus at most one unacknowledged add per
    killed client (the one in flight when it died);
  - every compare_set key has exactly one winner: every client that touched it got the same value
    back, and the key holds it.
Bounded: each client does at most OPS calls; every wait is a safety timeout. Everything started is
stopped at the end.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid


import ddprun_testlib as tl  # noqa: E402
import multinode_lib as ml  # noqa: E402

CLIENT = os.path.join(os.environ.get("DDPRUN_TEST_BIN") or os.path.join(tl.REPO, "build", "test-bin"),
                      "store_history_client")
CLIENTS = 4
OPS = 10000
CHAOS_S = 6
HOLD_S = 120  # the holding worker's own bound

HOLDER = r"""
import json, os, sys, time
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump(dict(os.environ), f)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(%d)
""" % HOLD_S


class StoreHistoryTest(ml.MultiNodeTestCase):

    def test_no_acknowledged_write_is_lost_under_client_crashes(self):
        self.assertTrue(os.access(CLIENT, os.X_OK), "store_history_client not built at %s" % CLIENT)
        port = ml.free_port()
        daemon = ml.Daemon(self, port, log_level="warning")
        env_file = os.path.join(self.tmp, "worker_env.json")
        holder = self.write_file("holder.py", HOLDER)
        self.run_id = "history-" + uuid.uuid4().hex[:8]
        agent = self.agent("h", self.elastic_args(1, port, conf="is_host=0") +
                           ["--max_restarts=0", sys.executable, holder, env_file])
        deadline = time.monotonic() + ml.SAFETY_TIMEOUT_S
        while not os.path.exists(env_file):
            self.assertIsNone(agent.poll(), "the holding job ended\n%s" % agent.result(agent.poll()).describe())
            self.assertLess(time.monotonic(), deadline, "the holding worker never started")
            time.sleep(0.05)
        with open(env_file) as f:
            env = json.load(f)

        logs = os.path.join(self.tmp, "logs")
        os.makedirs(logs)
        procs = {}
        incarnations = {}
        kills = 0

        def start(slot):
            incarnations[slot] = incarnations.get(slot, -1) + 1
            cid = "c%di%d" % (slot, incarnations[slot])
            procs[slot] = subprocess.Popen([CLIENT, "run", cid, os.path.join(logs, cid + ".log"), str(OPS)],
                                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        rng = random.Random(int(os.environ.get("DDPRUN_CHAOS_SEED", "7")))
        try:
            for slot in range(CLIENTS):
                start(slot)
            end = time.monotonic() + CHAOS_S
            while time.monotonic() < end:
                time.sleep(rng.uniform(0.1, 0.4))
                # A running client if there is one: with only finished ones to pick from, a fast
                # machine's run killed none (all 4 had done their calls between two picks).
                running = [s for s in range(CLIENTS) if procs[s].poll() is None]
                slot = rng.choice(running) if running else rng.randrange(CLIENTS)
                if procs[slot].poll() is None:
                    procs[slot].send_signal(signal.SIGKILL)
                    procs[slot].communicate(timeout=10)
                    kills += 1
                start(slot)
            for slot, p in procs.items():
                try:
                    _, err = p.communicate(timeout=ml.SAFETY_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    self.fail("store client %d did not finish its %d calls" % (slot, OPS))
                self.assertEqual(p.returncode, 0, "store client %d failed: %s" % (slot, err))
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                p.communicate(timeout=10)
        self.assertGreater(kills, 0, "no client was killed: the test checked nothing under crashes")

        sets, adds, cas = {}, 0, {}
        for name in os.listdir(logs):
            with open(os.path.join(logs, name)) as f:
                for line in f:
                    parts = line.split()
                    self.assertTrue(parts and line.endswith("\n"), "torn log line in %s: %r" % (name, line))
                    if parts[0] == "set":
                        sets[parts[1]] = parts[2]
                    elif parts[0] == "add":
                        adds += int(parts[1])
                    else:
                        cas.setdefault(parts[1], set()).add(parts[2])
        self.assertGreater(len(sets), 100, "too little history to check")

        keys = sorted(sets) + ["counter"] + sorted(cas)
        got = subprocess.run([CLIENT, "get"], env=env, input="\n".join(keys) + "\n", capture_output=True,
                             text=True, timeout=ml.SAFETY_TIMEOUT_S)
        self.assertEqual(got.returncode, 0, got.stderr)
        values = dict(line.split("\t", 1) for line in got.stdout.splitlines())
        lost = [k for k in sets if values.get(k) != sets[k]]
        self.assertEqual(lost, [], "%d acknowledged sets lost or changed, e.g. %s" % (
            len(lost), [(k, sets[k], values.get(k)) for k in lost[:5]]))
        counter = int(values["counter"])
        self.assertGreaterEqual(counter, adds, "acknowledged adds lost: counter %d < %d acknowledged" % (counter, adds))
        self.assertLessEqual(counter, adds + kills,
                             "counter %d exceeds %d acknowledged adds + %d in flight at kills" % (counter, adds, kills))
        split = {k: v for k, v in cas.items() if len(v) != 1}
        self.assertEqual(split, {}, "compare_set keys with more than one winner")
        wrong = [k for k, v in cas.items() if values.get(k) != next(iter(v))]
        self.assertEqual(wrong, [], "compare_set keys whose value is not the winner's")

        agent.proc.send_signal(signal.SIGTERM)
        agent.wait(ml.SAFETY_TIMEOUT_S)
        daemon.proc.send_signal(signal.SIGTERM)
        self.assert_exit(daemon.wait(15), 0)
        self.assert_no_leftovers([agent])


if __name__ == "__main__":
    tl.main()
