"""Elastic membership, the rendezvous daemon's lifetime, and job tokens (agents on loopback).

- A new agent joining a running --nnodes=1:3 job grows it: the running workers restart into a
  round whose WORLD_SIZE includes the newcomer; the restart budget is not spent.
- A ddprun-rdzv daemon killed (SIGKILL) and restarted on the same port while a job runs: the old
  agents do not silently continue; they fail with a clear error and exit status 1 (could not run
  the job), and leave nothing.
- One daemon serves two jobs at once, apart by run id, and a finished job's id can run again.
- The daemon raises its open file limit to the hard limit (one fd per agent and store client) and
  warns when that is small.
- Tokens: agents with the daemon's (or the hosting agent's) token run; an agent with a wrong token
  or none fails with exit status 1, naming the token, without disturbing the job; the token
  appears in no process's command line and in no output.

Time limits are safety timeouts (SAFETY_TIMEOUT_S), not speed claims: the workers hold for 60 s
unless their agents restart or stop them, longer than any of these limits.
"""

import os
import uuid

import multinode_lib as ml
from ddprun_testlib import main


def all_cmdlines():
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    out[int(entry)] = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                pass
    return out


class MultiNodeElasticTest(ml.MultiNodeTestCase):

    def round_of(self, nodes, nproc, after=0):
        """Predicate: a round newer than `after` holds every worker of `nodes`, with the right size."""
        world = nproc * len(nodes)

        def check(recs):
            return any(rn > after and ml.round_complete(recs, rn, nodes, nproc, world)
                       for rn in {r["round"] for r in recs})
        return check

    def current_round(self, recs, nodes, nproc):
        world = nproc * len(nodes)
        return max(rn for rn in {r["round"] for r in recs} if ml.round_complete(recs, rn, nodes, nproc, world))

    # --- growing ---------------------------------------------------------------------------
    def test_new_agent_grows_running_job(self):
        port = ml.free_port()
        prog = self.recorder()
        conf = "last_call_timeout=0.3"
        a = self.agent("a", self.elastic_args("1:3", port, nproc=2, conf=conf, extra=["--max_restarts=1"]) + [prog])
        self.wait_records(self.round_of("a", 2), 15, [a], "agent a's first round")
        round1 = self.current_round(self.records(), "a", 2)

        b = self.agent("b", self.elastic_args("1:3", port, nproc=2, conf=conf, extra=["--max_restarts=1"]) + [prog])
        jobs = [a, b]
        # Agent a's workers hold for 60 s: only a join that interrupts the running round makes the
        # grown round within the safety timeout.
        self.wait_records(self.round_of("ab", 2, after=round1), ml.SAFETY_TIMEOUT_S, jobs,
                          "a round of both agents (the join must interrupt the running round)")
        recs = self.records()
        round2 = self.current_round(recs, "ab", 2)
        new = [r for r in recs if r["round"] == round2]
        self.assertEqual({(r["world"], r["group_world"]) for r in new}, {(4, 2)}, recs)
        self.assertEqual(sorted(r["rank"] for r in new), [0, 1, 2, 3], recs)
        # The running node keeps its ranks; the newcomer is appended.
        self.assertEqual(sorted((r["node"], r["rank"]) for r in new), [("a", 0), ("a", 1), ("b", 2), ("b", 3)], recs)
        self.assertEqual(sorted(r["round"] for r in recs if r["node"] == "a" and r["local_rank"] == 0)[:2],
                         [round1, round2], "agent a's workers were not restarted into the grown round: %s" % recs)
        self.assertEqual({r["restart"] for r in recs}, {0}, "joining spent the restart budget: %s" % recs)

        self.release()
        for res in self.wait_all(jobs, 15):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)

    # --- the daemon dies -------------------------------------------------------------------
    def test_daemon_restart_fails_old_agents(self):
        port = ml.free_port()
        daemon = ml.Daemon(self, port)
        prog = self.recorder()
        jobs = [self.agent(t, self.elastic_args(2, port, nproc=2, conf="is_host=0") + [prog]) for t in ("a", "b")]
        self.wait_records(self.round_of("ab", 2), 15, jobs, "the first round")
        round1 = self.current_round(self.records(), "ab", 2)

        daemon.kill()
        self.assertEqual(daemon.proc.wait(5), -9)
        new_daemon = ml.Daemon(self, port)  # the same port: agents that reconnect reach a daemon without the job
        results = self.wait_all(jobs, ml.SAFETY_TIMEOUT_S)
        for res in results:
            self.assertEqual(res.returncode, ml.EXIT_INFRASTRUCTURE,
                             "an agent whose rendezvous died must exit with the infrastructure code\n" + self.describe_all(jobs))
            self.assertIn("rendezvous", res.stderr.lower(), "no clear error\n" + res.describe())
            self.assert_no_crash_text(res.stderr, res)
        self.assert_no_leftovers(jobs)
        recs = self.records()
        self.assertEqual({r["round"] for r in recs}, {round1},
                         "workers ran another round after the daemon died: %s" % recs)
        self.assertIsNone(new_daemon.poll(), "the new daemon died\n" + new_daemon.result(new_daemon.poll()).describe())

    def test_daemon_serves_two_jobs_by_run_id(self):
        port = ml.free_port()
        ml.Daemon(self, port)
        prog = self.recorder()
        base = self.run_id
        jobs = []
        for job in ("x", "y"):
            self.run_id = base + "_" + job
            jobs += [self.agent(job + t, self.elastic_args(2, port, nproc=2, conf="is_host=0") + [prog]) for t in "ab"]
        # Both jobs run at the same time, each a world of its own.
        self.wait_records(lambda recs: self.round_of(["xa", "xb"], 2)(recs) and self.round_of(["ya", "yb"], 2)(recs),
                          15, jobs, "both jobs' rounds")
        recs = self.records()
        for job in ("x", "y"):
            mine = [r for r in recs if r["node"].startswith(job)]
            self.assertEqual(sorted(r["rank"] for r in mine), [0, 1, 2, 3], recs)
            self.assertEqual({(r["world"], r["group_world"]) for r in mine}, {(4, 2)}, recs)
            # Each node's agent serves torch's store: one port per node, on loopback.
            self.assertEqual(len({(r["node"], r["master_port"]) for r in mine}), 2, recs)
            self.assertEqual({r["master_addr"] for r in mine}, {"127.0.0.1"}, recs)
        self.release()
        for res in self.wait_all(jobs, 15):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)

        # A finished job's id can be used again for a new run on the same daemon.
        self.run_id = base + "_x"
        again = [self.agent("z" + t, self.elastic_args(2, port, nproc=2, conf="is_host=0") + [prog]) for t in "ab"]
        for res in self.wait_all(again, 15):
            self.assert_exit(res, 0)
        self.assertEqual(sorted(r["rank"] for r in self.records() if r["node"].startswith("z")), [0, 1, 2, 3])

    def test_daemon_takes_the_hard_open_file_limit(self):
        # Each agent and each store client holds a connection of the daemon: with the usual soft
        # limit (1024) it would stop near a thousand. It raises its soft limit to the hard one, and
        # says so when even that is small.
        roomy = ml.Daemon(self, ml.free_port(), prefix=["prlimit", "--nofile=256:8192", "--"])
        self.assertEqual(ml.open_file_limits(roomy.pid), (8192, 8192))
        self.assertNotIn("connections open", roomy.stderr())
        small = ml.Daemon(self, ml.free_port(), prefix=["prlimit", "--nofile=200:300", "--"])
        self.assertEqual(ml.open_file_limits(small.pid), (300, 300))
        # The count the cap allows: (300 - 128 in reserve) / 3 descriptors per guarded connection.
        self.assertIn("can keep at most 57 connections open (open-file limit 300 less 128 in reserve, 3 descriptor(s) "
                      "per connection with the connection guard", small.stderr())
        # Still a working daemon.
        prog = self.recorder()
        self.release()
        jobs = [self.agent(t, self.elastic_args(2, small.port, conf="is_host=0") + [prog]) for t in "ab"]
        for res in self.wait_all(jobs, 20):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)

    # --- tokens ----------------------------------------------------------------------------
    def token_files(self):
        token = "tok-" + uuid.uuid4().hex
        wrong = "bad-" + uuid.uuid4().hex
        good_path = self.write_file("token", token + "\n")
        wrong_path = self.write_file("wrong_token", wrong + "\n")
        os.chmod(good_path, 0o600)
        return token, good_path, wrong, wrong_path

    def assert_token_hidden(self, secrets, procs):
        for pid, cmd in all_cmdlines().items():
            for secret in secrets:
                self.assertNotIn(secret, cmd, "a token is on the command line of pid %d: %s" % (pid, cmd))
        for p in procs:
            for secret in secrets:
                self.assertNotIn(secret, p.stdout() + p.stderr(), "a token is in the output of %s" % p.cmd)

    def check_token_job(self, port, files, conf_good, conf_wrong, conf_none, daemon=None):
        token, good_path, wrong, wrong_path = files
        prog = self.recorder()
        conf = "last_call_timeout=0.5," + conf_good.format(good=good_path)
        # With room for a third node (2:3), an intruder that was let in would restart the job.
        # Debug logging on one agent and on the intruders: the token must not show even there.
        jobs = [self.agent(t, self.elastic_args("2:3", port, nproc=1, conf=conf, extra=ll) + [prog])
                for t, ll in (("a", ["--log_level=debug"]), ("b", []))]
        self.wait_records(self.round_of("ab", 1), 15, jobs, "the round of the agents with the token")
        round1 = self.current_round(self.records(), "ab", 1)
        self.assert_token_hidden([token], jobs + ([daemon] if daemon else []))

        intruders = []
        for tag, extra in (("w", conf_wrong.format(wrong=wrong_path)), ("n", conf_none)):
            conf_i = "last_call_timeout=0.5,join_timeout=10" + ("," + extra if extra else "")
            intruders.append(self.agent(tag, self.elastic_args("2:3", port, nproc=1, conf=conf_i,
                                                               extra=["--log_level=debug"]) + [prog],
                                        env={"DDPRUN_RDZV_TOKEN": None}))
        for res in self.wait_all(intruders, ml.SAFETY_TIMEOUT_S):
            # Refused at once as a configuration error (exit 2), not "lost the rendezvous" later.
            self.assert_exit(res, 2)
            self.assertIn("refused the job token (UNAUTHENTICATED)", res.stderr,
                          "the error does not say the token was refused\n" + res.describe())
            self.assert_no_crash_text(res.stderr, res)
        self.assert_token_hidden([token, wrong], jobs + intruders + ([daemon] if daemon else []))

        recs = self.records()
        self.assertEqual({r["round"] for r in recs}, {round1}, "a refused agent disturbed the job: %s" % recs)
        self.assertEqual({r["node"] for r in recs}, {"a", "b"}, recs)
        self.release()
        for res in self.wait_all(jobs, 15):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs + intruders)
        self.assert_token_hidden([token, wrong], jobs + intruders + ([daemon] if daemon else []))

    def test_token_with_daemon(self):
        port = ml.free_port()
        files = self.token_files()
        daemon = ml.Daemon(self, port, token_file=files[1], log_level="debug")
        self.check_token_job(port, files, "is_host=0,token_file={good}", "is_host=0,token_file={wrong}", "is_host=0",
                             daemon=daemon)

    def test_token_with_embedded_host(self):
        port = ml.free_port()
        self.check_token_job(port, self.token_files(), "token_file={good}", "is_host=0,token_file={wrong}", "is_host=0")


if __name__ == "__main__":
    main()
