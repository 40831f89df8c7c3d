"""HTTP/2 abuse against ddprun-rdzv: memory stays bounded, jobs keep running, memory comes back.

The attacker (http2_attack.py: raw HTTP/2 frames, no token) connects from 127.0.0.2, another
loopback address, so that the daemon's penalty for its address does not touch the agents on
127.0.0.1. Before the fix, 4 seconds of rapid reset (HEADERS then RST_STREAM in a loop) grew the
daemon past 5 GB, kept it busy for tens of seconds after the attack and never gave the memory
back. The daemon runs here under an address-space limit (MEMORY_CAP), so that a regression fails
the test (the daemon dies, or its RSS passes the bound) instead of exhausting the machine.

Each case: daemon with a job token (the connection guard is on by default then), an attack of
ATTACK_S seconds while a 2-node job with the right token rendezvouses and runs, checks on the RSS
peak during the attack, the job's exit, a job after the attack, RSS back near its start once the
daemon trims (every 5 s), and a clean SIGTERM. A case without a token runs with
--connection_guard=on. Bounds are memory bounds and safety timeouts, not speed claims.
"""

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import multinode_lib as ml
from ddprun_testlib import main

HERE = os.path.dirname(os.path.abspath(__file__))
ATTACK = os.path.join(HERE, "http2_attack.py")
ATTACK_S = 4
MEMORY_CAP = 3 << 30          # the daemon's address-space limit: the machine is never at risk
PEAK_BOUND_KB = 400 * 1024    # RSS the daemon may reach during an attack (it stayed under 40 MB)
SETTLED_BOUND_KB = 64 * 1024  # RSS above the start it may keep once the attack is over
JOB_S = 60                    # safety bound for a 2-node job


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssSampler:
    """Samples a process's RSS every 50 ms in a thread; keeps the peak."""

    def __init__(self, pid):
        self.pid = pid
        self.peak = 0
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            self.peak = max(self.peak, rss_kb(self.pid))
            time.sleep(0.05)

    def stop(self):
        self.running = False
        self.thread.join(5)
        return self.peak


class Http2AbuseTest(ml.MultiNodeTestCase):

    def start_daemon(self, extra=(), token=True):
        self.token_path = None
        if token:
            self.token_path = self.write_file("token", "tok-%s\n" % uuid.uuid4().hex)
            os.chmod(self.token_path, 0o600)
        port = ml.free_port()
        return ml.Daemon(self, port, token_file=self.token_path, log_level="warning", extra=extra,
                         prefix=["prlimit", "--as=%d" % MEMORY_CAP, "--"])

    def attack(self, port, kind, seconds=ATTACK_S, connections=4, where=("--source", "127.0.0.2")):
        return subprocess.Popen([sys.executable, ATTACK, "--port", str(port), "--attack", kind, "--seconds",
                                 str(seconds), "--connections", str(connections)] + list(where),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def job(self, port, tag):
        conf = "is_host=0"
        if self.token_path:
            conf += ",token_file=" + self.token_path
        self.run_id = "abuse-%s-%s" % (tag, uuid.uuid4().hex[:8])
        return [self.agent(t, self.elastic_args(2, port, conf=conf) + ["--no_python", "/bin/sleep", "1"])
                for t in "ab"]

    def assert_alive(self, daemon, when):
        self.assertIsNone(daemon.poll(), "the daemon died %s (memory cap %d MiB)\n%s" % (
            when, MEMORY_CAP >> 20, daemon.result(daemon.poll()).describe()))

    def run_attack_case(self, kind, extra=(), token=True, where=("--source", "127.0.0.2")):
        daemon = self.start_daemon(extra, token)
        start_kb = rss_kb(daemon.pid)
        sampler = RssSampler(daemon.pid)
        attacker = self.attack(daemon.port, kind, where=where)
        time.sleep(0.5)  # the attack is under way when the job starts
        jobs = self.job(daemon.port, "during")
        try:
            out, err = attacker.communicate(timeout=ATTACK_S + 30)
        except subprocess.TimeoutExpired:
            attacker.kill()
            out, err = attacker.communicate()
            self.fail("the attacker did not end\n" + err)
        self.assertIn('"frames"', out, "the attacker failed\n" + err)
        results = self.wait_all(jobs, JOB_S)
        peak = sampler.stop()
        self.assert_alive(daemon, "during the attack")
        for res in results:
            self.assert_exit(res, 0)
        self.assertLess(peak, PEAK_BOUND_KB, "daemon RSS peaked at %d MiB during a %s attack (%s)" % (
            peak >> 10, kind, out.strip()))
        # After the attack: a new job, and the memory handed back.
        for res in self.wait_all(self.job(daemon.port, "after"), JOB_S):
            self.assert_exit(res, 0)
        deadline = time.monotonic() + 20
        while rss_kb(daemon.pid) > start_kb + SETTLED_BOUND_KB and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertLessEqual(rss_kb(daemon.pid), start_kb + SETTLED_BOUND_KB,
                             "daemon RSS stayed at %d MiB after the attack (started at %d MiB)" % (
                                 rss_kb(daemon.pid) >> 10, start_kb >> 10))
        daemon.proc.send_signal(signal.SIGTERM)
        self.assert_exit(daemon.wait(15), 0)
        return out, daemon

    def test_rapid_reset_without_the_token(self):
        out, daemon = self.run_attack_case("rapid_reset")
        self.assertIn("closed a connection from 127.0.0.2", daemon.stderr(), "the attacker was never cut off")

    def run_job_at_the_attackers_address(self, daemon, attack_s, job_s, tag, admitted):
        """A 2-node job while a rapid-reset attacker at the agents' own address (127.0.0.1) lasts
        longer than `job_s`, once the attacker was first cut off: the job must succeed during it,
        and the daemon must say it let the address's connections in as `admitted`."""
        attacker = self.attack(daemon.port, "rapid_reset", seconds=attack_s, where=("--source", "127.0.0.1"))
        try:
            deadline = time.monotonic() + 20
            while "from 127.0.0.1" not in daemon.stderr():
                self.assertLess(time.monotonic(), deadline, "the attacker was never cut off:\n" + daemon.stderr())
                time.sleep(0.1)
            started = time.monotonic()
            for res in self.wait_all(self.job(daemon.port, tag), job_s):
                self.assert_exit(res, 0)
            print("a 2-node job (%s) behind the attacker's address: %.2f s" % (tag, time.monotonic() - started),
                  file=sys.stderr)
            self.assertIsNone(attacker.poll(), "the attack ended before the job: the test proves nothing")
            self.assertIn("%s a connection from 127.0.0.1" % admitted, daemon.stderr())
        finally:
            attacker.kill()
            attacker.communicate()
        self.assert_alive(daemon, "after the attack")

    def test_agents_at_the_attackers_address_keep_joining(self):
        # Issue #24 item 8: the attacker at the agents' own address (one host, or a NAT gateway in
        # front of both). Its address is penalized for most of the attack, and the penalty used to
        # refuse every connection from it, the agents' too: the job could not rendezvous while the
        # attack lasted. Now a penalized address's connections are let in gated, and the agents'
        # carry the token in their first request. The attack lasts longer than the job's safety
        # bound: the job must succeed during it.
        self.run_job_at_the_attackers_address(self.start_daemon((), True), JOB_S + 30, JOB_S, "nat",
                                              "admitted only with the job token")

    def test_agents_at_the_attackers_address_keep_joining_without_a_token(self):
        # Issue #37 item 2: with no job token there is nothing to gate on, and a penalized address
        # was refused outright: a 2-node job behind the attacker's address took 49 s instead of
        # 0.02 s (the penalty doubles up to 60 s). Now its connections are let in on probation, as
        # strangers. The bound is a safety bound with the old figure far outside it; the attack
        # lasts longer than it.
        JOB_BOUND_S = 20
        self.run_job_at_the_attackers_address(self.start_daemon(("--connection_guard", "on"), False),
                                              JOB_BOUND_S + 30, JOB_BOUND_S, "nat-no-token",
                                              "admitted on probation (as a stranger)")

    def test_rapid_reset_from_a_new_address_for_every_connection(self):
        # No per-address penalty stops this attacker; an unauthenticated connection may open only
        # a few streams (AbuseLimits::untrustedCallBurst), so each new connection costs it more
        # than it costs the daemon.
        self.run_attack_case("rapid_reset", where=("--spread", "--per_connection", "16"))

    def test_open_streams_without_the_token(self):
        self.run_attack_case("open_streams")

    def test_ping_flood_without_the_token(self):
        self.run_attack_case("ping_flood")

    def test_rapid_reset_on_a_loopback_daemon_with_no_token_and_no_options(self):
        # The configuration that was unguarded: a local process is not necessarily a trusted one
        # (a shared login node). It grew to 537 MB, which stayed after the attack.
        out, daemon = self.run_attack_case("rapid_reset", token=False)
        self.assertIn("opened streams faster than allowed", daemon.stderr())

    def test_rapid_reset_with_the_guard_off(self):
        # Issue #37 item 1: off, connections went to gRPC 1.51 unrelayed, and 3 s of rapid reset
        # from one thread took the daemon to 1.6-2.8 GB, still held 60 s later. Off now turns off
        # only the token gate: the frame limits cut the attacker and its address is refused a while.
        for token in (False, True):
            out, daemon = self.run_attack_case("rapid_reset", extra=["--connection_guard", "off"], token=token)
            self.assertIn("closed a connection from 127.0.0.2", daemon.stderr(), "the attacker was never cut off")

    def test_rapid_reset_with_the_guard_and_no_token(self):
        out, daemon = self.run_attack_case("rapid_reset", extra=["--connection_guard", "on"], token=False)
        self.assertIn("opened streams faster than allowed", daemon.stderr())

    def test_status_from_a_penalized_address_with_a_wrong_token(self):
        # Issue #37: "cannot reach ...: Socket closed", exit 200. From a penalized address the guard
        # closes a request without the token before gRPC could answer "invalid job token".
        daemon = self.start_daemon()
        wrong = self.write_file("wrong_token", "not-the-token\n")
        os.chmod(wrong, 0o600)
        attacker = self.attack(daemon.port, "rapid_reset", seconds=8, connections=2, where=())
        self.addCleanup(lambda: attacker.poll() is None and attacker.kill())
        deadline = time.monotonic() + 10
        while "admitted only with the job token" not in daemon.stderr():
            self.assertLess(time.monotonic(), deadline, "the address was not penalized\n" + daemon.stderr())
            time.sleep(0.05)
        res = subprocess.run([ml.RDZV, "status", "--rdzv_endpoint", "127.0.0.1:%d" % daemon.port, "--token_file",
                              wrong, "--timeout", "5"], capture_output=True, text=True, timeout=30, env=ml.clean_env())
        attacker.kill()
        attacker.communicate(timeout=30)
        self.assertEqual(res.returncode, 2, res.stdout + res.stderr)
        lines = res.stderr.splitlines()
        self.assertEqual(len(lines), 1, res.stderr)
        self.assertIn("invalid job token", lines[0])
        self.assertIn("--token_file", lines[0])


if __name__ == "__main__":
    main()
