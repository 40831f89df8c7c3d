"""TLS and mTLS on ddprun's own channels (README "Security"), with certificates the test makes with
openssl (tests/support/tls_pki.py) and a real ddprun-rdzv, real agents and real C++ SDK workers
(examples/train on gloo, whose store is the daemon's: DDPRUN_STORE_ADDR).

- A 2-node elastic job and its workers' store over TLS, and over mTLS with --tls_allowed_names; the
  job token never appears on the wire (tcpdump on loopback; the same capture of a plaintext job
  finds it, so the search can fail).
- Each configuration error ends the agent with exit 2 and one line saying which, within seconds
  (not its join timeout): an expired, untrusted or misnamed server certificate, a plaintext agent
  against a TLS daemon and the reverse, a missing or refused client certificate.
- Rotation: the daemon's certificate is replaced and SIGHUP sent; a new connection gets the new one
  while a session opened before keeps going.
- A flood of connections that start a TLS handshake and stall does not stop a real job.
"""

import os
import shutil
import signal
import socket
import subprocess
import time

import multinode_lib as ml
import ddprun_testlib as tl
import tls_pki
from ddprun_testlib import main

TRAIN = os.path.join(tl.BIN_DIR, "train")
TRAIN_ARGS = ["--epochs", "2", "--samples", "256", "--timeout", "60"]
JOB_TIMEOUT_S = 60
# A configuration error is said at once; this bound only keeps a regression from hanging the test.
ERROR_TIMEOUT_S = 20
TOKEN = "tls-test-token-5f3a9c1e7b2d4086"


class TlsTest(ml.MultiNodeTestCase):
    pki = None

    @classmethod
    def setUpClass(cls):
        cls.pki_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ddprun_tls_pki_%d" % os.getpid())
        cls.pki = tls_pki.make_pki(cls.pki_dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.pki_dir, ignore_errors=True)

    def setUp(self):
        super().setUp()
        self.assertTrue(os.access(TRAIN, os.X_OK), "train not found at %s" % TRAIN)
        self.token_file = self.write_file("token", TOKEN + "\n")

    # --- helpers ---------------------------------------------------------------------------
    def daemon(self, cert="server", client_ca=None, allowed=None, extra=()):
        args = []
        if cert:
            args += ["--tls_cert", self.pki[cert], "--tls_key", self.pki[cert + "_key"]]
        if client_ca:
            args += ["--tls_client_ca", self.pki[client_ca]]
        if allowed:
            args += ["--tls_allowed_names", allowed]
        return ml.Daemon(self, ml.free_port(), token_file=self.token_file, extra=args + list(extra))

    def conf(self, tls=True, ca="ca", client=None):
        parts = ["token_file=%s" % self.token_file, "join_timeout=120"]
        if tls:
            parts.append("protocol=https")
            if ca:
                parts.append("cacert=%s" % self.pki[ca])
            if client:
                parts += ["cert=%s" % self.pki[client], "key=%s" % self.pki[client + "_key"]]
        return ",".join(parts)

    def job(self, daemon, confs, tag="n"):
        return [self.agent("%s%d" % (tag, i), self.elastic_args(len(confs), daemon.port, conf=c) + [TRAIN] + TRAIN_ARGS)
                for i, c in enumerate(confs)]

    def assert_job_passes(self, jobs):
        for res in self.wait_all(jobs, JOB_TIMEOUT_S):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(jobs)

    def assert_config_error(self, daemon, conf, expected):
        """One agent against `daemon` exits 2 within seconds, saying `expected` on one line."""
        job = self.agent("bad", self.elastic_args(2, daemon.port, conf=conf) + [TRAIN] + TRAIN_ARGS)
        res = job.wait(ERROR_TIMEOUT_S)
        self.assert_exit(res, 2)
        lines = [l for l in res.stderr.splitlines() if expected in l]
        self.assertTrue(lines, "no line says %r\n%s" % (expected, res.describe()))
        self.assertIn("cannot connect to the rendezvous", lines[0], res.describe())
        self.assert_no_crash_text(res.stderr, res)
        self.assert_no_leftovers([job])
        return res

    def capture(self, port):
        """tcpdump of loopback traffic to and from `port`, as raw bytes once stopped."""
        if not shutil.which("tcpdump"):
            self.skipTest("tcpdump is not installed (scripts/install_deps.sh installs it)")
        pcap = self.path("lo_%d.pcap" % port)
        # --immediate-mode: else packets wait in the kernel's ring for a block timeout, and a SIGINT
        # before it loses them.
        proc = subprocess.Popen(["tcpdump", "-i", "lo", "--immediate-mode", "-U", "-s", "0", "-w", pcap,
                                 "tcp port %d" % port],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        deadline = time.monotonic() + 10
        while not os.path.exists(pcap) or os.path.getsize(pcap) == 0:  # the pcap header: it listens
            if proc.poll() is not None:
                self.skipTest("tcpdump cannot capture here: %s" % proc.stderr.read().decode(errors="replace")[:300])
            if time.monotonic() > deadline:
                self.fail("tcpdump did not start")
            time.sleep(0.05)
        time.sleep(0.2)

        def stop():
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=10)
            with open(pcap, "rb") as f:
                return f.read()
        return stop

    def peer_subject(self, port):
        """The subject of the certificate the daemon shows a new connection now."""
        out = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % port, "-CAfile", self.pki["ca"],
                              "-alpn", "h2", "-verify_return_error"], input=b"", capture_output=True, timeout=15)
        text = out.stdout.decode(errors="replace")
        subject = [l for l in text.splitlines() if l.startswith("subject=")]
        self.assertTrue(subject, "openssl s_client saw no certificate\n%s\n%s" % (text, out.stderr.decode()))
        return subject[0]

    # --- a job over TLS ----------------------------------------------------------------------
    def test_job_and_store_over_tls_and_the_token_never_on_the_wire(self):
        daemon = self.daemon()
        stop = self.capture(daemon.port)
        self.assert_job_passes(self.job(daemon, [self.conf(), self.conf()]))
        wire = stop()
        self.assertGreater(len(wire), 10000, "the capture holds too little to mean anything")
        self.assertNotIn(TOKEN.encode(), wire, "the job token crossed loopback in clear under TLS")

        # The control: the same job in plaintext puts the token on the wire, so the search works.
        plain = ml.Daemon(self, ml.free_port(), token_file=self.token_file)
        stop = self.capture(plain.port)
        self.assert_job_passes(self.job(plain, [self.conf(tls=False), self.conf(tls=False)], tag="p"))
        self.assertIn(TOKEN.encode(), stop(), "the plaintext control did not capture the token")

    def test_mtls_job_with_allowed_names_and_an_intruder_refused(self):
        daemon = self.daemon(client_ca="ca", allowed="node-*.job1.example")
        self.assert_job_passes(self.job(daemon, [self.conf(client="client_a"), self.conf(client="client_b")]))
        res = self.assert_config_error(daemon, self.conf(client="client_intruder"),
                                       "the server refused this node's certificate")
        self.assertIn("closed a TLS connection from 127.0.0.1", daemon.stderr(), res.describe())
        self.assertIn("certificate rejected", daemon.stderr())
        self.assert_config_error(daemon, self.conf(client="client_other_ca"),
                                 "the server refused this node's certificate")
        self.assert_config_error(daemon, self.conf(), "the server requires a client certificate")

    # --- configuration errors: exit 2, one line ----------------------------------------------
    def test_untrusted_expired_and_misnamed_server_certificates(self):
        self.assert_config_error(self.daemon(cert="server_expired"), self.conf(),
                                 "the server's certificate has expired")
        self.assert_config_error(self.daemon(cert="server_other_ca"), self.conf(),
                                 "the server's certificate is not signed by the CA in cacert")
        self.assert_config_error(self.daemon(cert="server_wrong_name"), self.conf(),
                                 "the server's certificate does not name 127.0.0.1")

    def test_plaintext_on_one_side_only(self):
        self.assert_config_error(self.daemon(), self.conf(tls=False), "this server requires TLS")
        plain = ml.Daemon(self, ml.free_port(), token_file=self.token_file)
        self.assert_config_error(plain, self.conf(), "the server does not speak TLS")

    def test_bad_certificate_files_are_refused_at_start(self):
        res = tl.Result(*self._run_rdzv(["--tls_cert", self.pki["server"], "--tls_key", self.pki["client_a_key"]]))
        self.assertEqual(res.returncode, 2, res.describe())
        self.assertIn("is not the key of the certificate", res.stderr, res.describe())
        
        res = tl.Result(*self._run_rdzv(["--tls_cert", self.path("missing.pem"), "--tls_key", self.pki["server_key"]]))
        self.assertEqual(res.returncode, 2, res.describe())
        self.assertIn("cannot read it", res.stderr, res.describe())
        for res in [tl.Result(*self._run_rdzv(["--tls_allowed_names", "x*"]))]:
            self.assertEqual(res.returncode, 2, res.describe())

    def _run_rdzv(self, args):
        argv = [ml.RDZV, "--port", "0"] + args
        t0 = time.monotonic()
        out = subprocess.run(argv, capture_output=True, timeout=15, env=ml.clean_env())
        return out.returncode, out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace"), \
            time.monotonic() - t0, argv

    # --- an agent that hosts the rendezvous, across network namespaces ------------------------
    def test_agent_hosted_mtls_job_across_network_namespaces(self):
        from netns_lib import make_test_hosts
        h = make_test_hosts(self, ["a", "b"])
        port = ml.free_port()
        jobs = []
        for t, cert in (("a", "client_a"), ("b", "client_b")):  # a owns 192.0.2.1: it hosts
            conf = self.conf(client=cert) + ",server_cert=%s,server_key=%s" % (self.pki["server"], self.pki["server_key"])
            jobs.append(self.agent(t, self.elastic_args(2, port, conf=conf, host=h.addr["a"], extra=["--log_level=info"]) +
                                   [TRAIN] + TRAIN_ARGS,
                                   env={"GLOO_SOCKET_IFNAME": h.host_if[t]}, prefix=h.exec_prefix(t)))
        self.assert_job_passes(jobs)
        self.assertIn("hosting the rendezvous at 192.0.2.1", jobs[0].stderr(), self.describe_all(jobs))
        # The hosted server asks for a client certificate: a node without one is refused, exit 2.
        host = self.agent("a2", self.elastic_args(2, port, conf=self.conf(client="client_a") +
                                                  ",server_cert=%s,server_key=%s" % (self.pki["server"],
                                                                                     self.pki["server_key"]),
                                                  host=h.addr["a"], extra=["--log_level=info"]) + [TRAIN] + TRAIN_ARGS,
                          prefix=h.exec_prefix("a"))
        deadline = time.monotonic() + 15
        while "hosting the rendezvous" not in host.stderr():
            self.assertIsNone(host.poll(), host.result(host.poll()).describe())
            self.assertLess(time.monotonic(), deadline, host.result(None).describe())
            time.sleep(0.05)
        bad = self.agent("b2", self.elastic_args(2, port, conf=self.conf(), host=h.addr["a"]) + [TRAIN] + TRAIN_ARGS,
                         prefix=h.exec_prefix("b"))
        res = bad.wait(ERROR_TIMEOUT_S)
        self.assert_exit(res, 2)
        self.assertIn("the server requires a client certificate", res.stderr, res.describe())
        host.kill(signal.SIGTERM)
        host.wait(ml.SAFETY_TIMEOUT_S)

    def test_a_host_over_tls_needs_a_server_certificate(self):
        port = ml.free_port()
        job = self.agent("n0", ["--nnodes=2", "--node_rank=0", "--master_addr=127.0.0.1", "--master_port=%d" % port,
                                "--rdzv_conf=" + self.conf(), TRAIN] + TRAIN_ARGS)
        res = job.wait(ERROR_TIMEOUT_S)
        self.assert_exit(res, 2)
        self.assertIn("needs server_cert and server_key", res.stderr, res.describe())
        res = self.agent("n1", ["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % port,
                                "--rdzv_conf=cacert=%s" % self.pki["ca"], TRAIN]).wait(ERROR_TIMEOUT_S)
        self.assert_exit(res, 2)
        self.assertIn("need protocol=https", res.stderr, res.describe())

    def test_status_over_tls(self):
        daemon = self.daemon(client_ca="ca")
        self.assert_job_passes(self.job(daemon, [self.conf(client="client_a"), self.conf(client="client_b")]))
        base = [ml.RDZV, "status", "--rdzv_endpoint", "127.0.0.1:%d" % daemon.port, "--token_file", self.token_file,
                "--timeout", "5"]
        ok = subprocess.run(base + ["--tls_ca", self.pki["ca"], "--tls_cert", self.pki["client_a"], "--tls_key",
                                    self.pki["client_a_key"], "--json"], capture_output=True, text=True, timeout=30)
        self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        self.assertIn("jobs", ok.stdout)
        plain = subprocess.run(base, capture_output=True, text=True, timeout=30)
        self.assertEqual(plain.returncode, 2, plain.stdout + plain.stderr)
        self.assertIn("requires TLS", plain.stderr)
        nocert = subprocess.run(base + ["--tls_ca", self.pki["ca"]], capture_output=True, text=True, timeout=30)
        self.assertEqual(nocert.returncode, 2, nocert.stdout + nocert.stderr)
        self.assertIn("requires a client certificate", nocert.stderr)

    def test_status_without_a_client_certificate_and_an_expired_certificate_at_start(self):
        # Issue #37: status printed gRPC's own "E1129 ... ssl_transport_security.cc" lines before its
        # own, and a daemon started with an expired certificate said nothing.
        daemon = self.daemon(client_ca="ca")
        nocert = subprocess.run([ml.RDZV, "status", "--rdzv_endpoint", "127.0.0.1:%d" % daemon.port, "--token_file",
                                 self.token_file, "--timeout", "5", "--tls_ca", self.pki["ca"]],
                                capture_output=True, text=True, timeout=30, env=ml.clean_env())
        self.assertEqual(nocert.returncode, 2, nocert.stdout + nocert.stderr)
        lines = nocert.stderr.splitlines()
        self.assertEqual(len(lines), 1, "expected one line:\n" + nocert.stderr)
        self.assertIn("requires a client certificate (give --tls_cert and --tls_key)", lines[0])
        expired = self.daemon(cert="server_expired")
        said = [l for l in expired.stderr().splitlines() if "expired" in l]
        self.assertEqual(len(said), 1, "expected one warning at start:\n" + expired.stderr())
        self.assertIn(self.pki["server_expired"], said[0])
        self.assertRegex(said[0], r"expired on \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
        fresh = self.daemon()
        self.assertNotIn("TLS certificate", fresh.stderr())

    # --- rotation ----------------------------------------------------------------------------
    def test_sighup_rotates_the_certificate_and_open_sessions_go_on(self):
        cert, key = self.path("server.pem"), self.path("server.key")
        shutil.copy(self.pki["server"], cert)
        shutil.copy(self.pki["server_key"], key)
        daemon = ml.Daemon(self, ml.free_port(), token_file=self.token_file, extra=["--tls_cert", cert, "--tls_key", key])
        self.assertIn("CN = ddprun-rdzv", self.peer_subject(daemon.port))
        # A session open across the rotation: a job of 2 whose second node comes after it.
        first = self.agent("n0", self.elastic_args(2, daemon.port, conf=self.conf()) + [TRAIN] + TRAIN_ARGS)
        time.sleep(2)  # it has joined and waits for the second node (a join takes milliseconds)
        self.assertIsNone(first.poll(), first.result(first.poll()).describe())
        shutil.copy(self.pki["server_new"], cert)
        shutil.copy(self.pki["server_new_key"], key)
        os.kill(daemon.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reloaded the TLS certificate" not in daemon.stderr():
            self.assertLess(time.monotonic(), deadline, daemon.stderr())
            time.sleep(0.05)
        self.assertIn("CN = ddprun-rdzv rotated", self.peer_subject(daemon.port))
        second = self.agent("n1", self.elastic_args(2, daemon.port, conf=self.conf()) + [TRAIN] + TRAIN_ARGS)
        self.assert_job_passes([first, second])
        # A reload that fails keeps the certificate in use.
        with open(cert, "w") as f:
            f.write("not a certificate\n")
        os.kill(daemon.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "kept the previous TLS certificate" not in daemon.stderr():
            self.assertLess(time.monotonic(), deadline, daemon.stderr())
            time.sleep(0.05)
        self.assertIn("CN = ddprun-rdzv rotated", self.peer_subject(daemon.port))

    # --- a handshake flood ---------------------------------------------------------------------
    def test_stalled_handshakes_do_not_stop_a_job(self):
        daemon = self.daemon()
        stalled = []
        try:
            # Each sends the first bytes of a ClientHello, then nothing: the front door must hand
            # them to the handshake and bound them there, while a real job forms beside them.
            for _ in range(200):
                s = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
                s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
                stalled.append(s)
            self.assert_job_passes(self.job(daemon, [self.conf(), self.conf()]))
        finally:
            for s in stalled:
                s.close()
        self.assertIsNone(daemon.poll(), daemon.stderr())


if __name__ == "__main__":
    main()
