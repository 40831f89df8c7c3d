"""HTTP/2 abuse inside TLS against ddprun-rdzv: the connection guard still cuts the attacker,
memory stays bounded, a real TLS job keeps running, memory comes back.

With --tls_cert the daemon terminates TLS in the guard's relay (netguard/connection_relay.cc), so
that the frame limits see the decrypted frames. These are the attacks of
test_rdzv_http2_abuse.py (rapid reset, open streams, ping flood, from 127.0.0.2 without the job
token), made by the same attacker (http2_attack.py --tls_ca: a valid handshake that verifies the
daemon's certificate, ALPN h2, then the same frames inside the encrypted connection), while a
2-node job whose agents speak TLS (--rdzv_conf protocol=https,cacert=...) rendezvouses and runs.
Each case goes through test_rdzv_http2_abuse.py's own checks (its run_attack_case: the RSS peak
under the address-space cap, the job's exit, a job after the attack, the RSS back near its start,
a clean SIGTERM), with a TLS daemon, TLS agents and a TLS attacker in place of the plaintext ones;
then this file checks that the attacker's handshakes succeeded (so the abuse did reach the
relay's frame limits through TLS), that it read the guard's GOAWAY through TLS, and that the
daemon's log says the guard cut it. One case does it under mTLS with a client certificate the
daemon accepts (a node's certificate, stolen): the certificate is no licence to abuse.

And a handshake flood: 300 connections from 127.0.0.2 that send half a ClientHello (270: more
than the 256 handshakes one address may run at once, so some wait for a turn) or nothing (30),
and stall, while a 2-node TLS job forms beside them: the job passes, and the daemon closes every
stalled connection by its handshake timeout (10 s; twice that for those that waited a turn), or
earlier when it gives its turn up to one that waits (netguard/handshake_queue.h). And the same
flood, 1,500 strong, from the job's own address (issue #37 item 5): the job's handshakes wait
behind the stalled ones, which give their turns up one grace (1 s) after they fall silent, so the
job is delayed by less than a handshake timeout (it took 50 s when each batch of 256 held its
turns until its timeout). Bounds are memory bounds and safety timeouts, not speed claims.
"""

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
import uuid

import multinode_lib as ml
import tls_pki
# The module, for its test case's methods below; imported as a module, its tests are not collected
# into this file's (unittest collects only TestCase classes in this module's namespace).
import test_rdzv_http2_abuse as plain
from test_rdzv_http2_abuse import ATTACK, ATTACK_S, JOB_S, MEMORY_CAP, PEAK_BOUND_KB, RssSampler
from ddprun_testlib import main

STALLED = 300             # connections of the handshake flood
SILENT_EVERY = 10         # one in SILENT_EVERY of them sends nothing; the others half a ClientHello
HANDSHAKE_TIMEOUT_S = 10  # the daemon's (ConnectionListenerOptions::handshakeTimeout, not a flag)
STALLED_SAME_ADDRESS = 1500  # the flood from the job's own address (issue #37 item 5)
HANDSHAKES_PER_ADDRESS = 256  # at once (RelayTls::maxHandshakesPerAddress); the flood's wait a turn
# Half a ClientHello: a handshake record announcing 512 bytes, then the first 6 of them.
PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


class TlsAbuseTest(ml.MultiNodeTestCase):
    pki = None

    @classmethod
    def setUpClass(cls):
        cls.pki_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ddprun_tls_abuse_pki_%d" % os.getpid())
        cls.pki = tls_pki.make_pki(cls.pki_dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.pki_dir, ignore_errors=True)

    # --- test_rdzv_http2_abuse.py's helpers over TLS -------------------------------------------
    # Its checks, unchanged; they call the start_daemon, attack and job of this class.
    run_attack_case = plain.Http2AbuseTest.run_attack_case
    assert_alive = plain.Http2AbuseTest.assert_alive

    client_ca = False  # mTLS: the daemon asks for a client certificate; agents a and b, and the attacker, show one

    def start_daemon(self, extra=(), token=True):
        self.assertTrue(token, "TLS needs the connection guard, which a job token turns on")
        self.token_path = self.write_file("token", "tok-%s\n" % uuid.uuid4().hex)
        os.chmod(self.token_path, 0o600)
        tls = ["--tls_cert", self.pki["server"], "--tls_key", self.pki["server_key"]]
        if self.client_ca:
            tls += ["--tls_client_ca", self.pki["ca"], "--tls_allowed_names", "node-*.job1.example"]
        return ml.Daemon(self, ml.free_port(), token_file=self.token_path, log_level="warning",
                         extra=tls + list(extra), prefix=["prlimit", "--as=%d" % MEMORY_CAP, "--"])

    def attack(self, port, kind, seconds=ATTACK_S, connections=4, where=("--source", "127.0.0.2")):
        tls = ["--tls_ca", self.pki["ca"]]
        if self.client_ca:
            tls += ["--tls_cert", self.pki["client_a"], "--tls_key", self.pki["client_a_key"]]
        proc = subprocess.Popen([sys.executable, ATTACK, "--port", str(port), "--attack", kind, "--seconds",
                                 str(seconds), "--connections", str(connections)] + list(where) + tls,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.communicate()))
        return proc

    def conf(self, node):
        parts = ["is_host=0", "token_file=" + self.token_path, "protocol=https", "cacert=" + self.pki["ca"]]
        if self.client_ca:
            parts += ["cert=" + self.pki["client_" + node], "key=" + self.pki["client_%s_key" % node]]
        return ",".join(parts)

    def job(self, port, tag):
        self.run_id = "tls-abuse-%s-%s" % (tag, uuid.uuid4().hex[:8])
        return [self.agent(t, self.elastic_args(2, port, conf=self.conf(t)) + ["--no_python", "/bin/sleep", "1"])
                for t in "ab"]

    # --- the checks this file adds ---------------------------------------------------------------
    def run_tls_attack_case(self, kind):
        out, daemon = self.run_attack_case(kind)
        lines = [l for l in out.splitlines() if l.startswith("{")]
        self.assertTrue(lines, "the attacker printed no stats: %r" % out)
        stats = json.loads(lines[-1])
        self.assertTrue(stats.get("tls"), "the attacker did not speak TLS: %s" % stats)
        # Connections count once their handshake is done: the abuse went through TLS.
        self.assertGreater(stats["connections"], 0, "no TLS handshake of the attacker succeeded: %s" % stats)
        self.assertGreater(stats["frames"], 0, stats)
        self.assertGreater(stats["goaway"], 0, "the attacker never read a GOAWAY through TLS: %s" % stats)
        log = daemon.stderr()
        self.assertIn("closed a connection from 127.0.0.2", log,
                      "the guard never cut the TLS attacker (%s)\n%s" % (stats, log))
        return stats, log

    # --- the cases ---------------------------------------------------------------------------------
    def test_rapid_reset_inside_tls(self):
        stats, log = self.run_tls_attack_case("rapid_reset")
        self.assertIn("opened streams faster than allowed", log)

    def test_open_streams_inside_tls(self):
        self.run_tls_attack_case("open_streams")

    def test_ping_flood_inside_tls(self):
        stats, log = self.run_tls_attack_case("ping_flood")
        self.assertIn("sent control frames", log)

    def test_rapid_reset_inside_mtls_with_an_accepted_client_certificate(self):
        self.client_ca = True
        self.run_tls_attack_case("rapid_reset")

    def test_stalled_handshakes_from_another_address_do_not_stop_a_job(self):
        daemon = self.start_daemon()
        sampler = RssSampler(daemon.pid)
        stalled = []

        def close_all():
            for s in stalled:
                s.close()
        self.addCleanup(close_all)
        # Most send the first bytes of a ClientHello (the front door hands them to the relay's
        # handshake, where those past the address's HANDSHAKES_PER_ADDRESS wait a turn), the
        # others nothing (they wait in the front door): then nothing more.
        partial = [i % SILENT_EVERY != SILENT_EVERY - 1 for i in range(STALLED)]
        self.assertGreater(sum(partial), HANDSHAKES_PER_ADDRESS)
        started = time.monotonic()
        for sends in partial:
            s = socket.create_connection(("127.0.0.1", daemon.port), timeout=5, source_address=("127.0.0.2", 0))
            stalled.append(s)
            if sends:
                s.sendall(PARTIAL_CLIENT_HELLO)
        for res in self.wait_all(self.job(daemon.port, "flood"), JOB_S):
            self.assert_exit(res, 0)
        job_s = time.monotonic() - started
        # The flood was there while the job formed: the daemon closes a stalled connection only
        # at its handshake timeout, or when it gives its turn up to one of its address that waits
        # (at most as many as waited: those past the address's handshakes at once).
        open_after_job = [s for s in stalled if not self._ended(s, 0)]
        waited = sum(partial) - HANDSHAKES_PER_ADDRESS
        if job_s < HANDSHAKE_TIMEOUT_S - 1:
            self.assertGreaterEqual(len(open_after_job), STALLED - waited,
                                    "stalled connections ended before the handshake timeout, so the job (%.1f s) did "
                                    "not form beside all of them" % job_s)
        # Then the daemon closes every one of them (else a flood only has to wait to hold them all):
        # those that waited a turn, one timeout after the first ones.
        deadline = started + 2 * HANDSHAKE_TIMEOUT_S + 15
        still = [s for s in stalled if not self._ended(s, max(0, deadline - time.monotonic()))]
        self.assertEqual(len(still), 0, "%d of %d stalled connections were still open %.0f s after the flood\n%s" % (
            len(still), STALLED, time.monotonic() - started, daemon.stderr()))
        peak = sampler.stop()
        self.assert_alive(daemon, "after the handshake flood")
        self.assertLess(peak, PEAK_BOUND_KB, "daemon RSS peaked at %d MiB during a handshake flood" % (peak >> 10))
        self.assertIn("closed a TLS connection from 127.0.0.2", daemon.stderr())
        # And a job after it.
        for res in self.wait_all(self.job(daemon.port, "after"), JOB_S):
            self.assert_exit(res, 0)

    def test_stalled_handshakes_at_the_jobs_own_address_delay_it_less_than_a_handshake_timeout(self):
        daemon = self.start_daemon()
        stalled = []

        def close_all():
            for s in stalled:
                s.close()
        self.addCleanup(close_all)
        # From the agents' own address (a shared host, a NAT gateway): every one sends half a
        # ClientHello, so that each takes a handshake turn of 127.0.0.1 (those that send nothing
        # wait in the front door, which reads no handshake).
        for _ in range(STALLED_SAME_ADDRESS):
            s = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
            stalled.append(s)
            s.sendall(PARTIAL_CLIENT_HELLO)
        started = time.monotonic()
        for res in self.wait_all(self.job(daemon.port, "same-address-flood"), JOB_S):
            self.assert_exit(res, 0)
        job_s = time.monotonic() - started
        print("a 2-node TLS job behind %d stalled handshakes from its own address: %.2f s" % (STALLED_SAME_ADDRESS, job_s),
              file=sys.stderr)
        # A safety bound, not a speed claim: what the issue asked is that one address's stalled
        # handshakes delay its other connections by no more than a handshake timeout; twice that
        # leaves the slack of a loaded machine (before: 50 s).
        self.assertLess(job_s, 2 * HANDSHAKE_TIMEOUT_S,
                        "a 2-node TLS job behind %d stalled handshakes from its own address took %.1f s\n%s" % (
                            STALLED_SAME_ADDRESS, job_s, daemon.stderr()))
        self.assertIn("while other connections from its address waited their turn", daemon.stderr())
        self.assert_alive(daemon, "after the handshake flood at the job's address")

    @staticmethod
    def _ended(sock, timeout):
        """Whether the peer closed `sock` (EOF or reset) within `timeout` seconds; what it sends
        before (a TLS alert) is read and dropped."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                readable, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
                if readable and sock.recv(4096, socket.MSG_DONTWAIT) == b"":
                    return True
            except BlockingIOError:
                pass
            except OSError:  # reset
                return True
            if time.monotonic() >= deadline:
                return False

if __name__ == "__main__":
    main()
