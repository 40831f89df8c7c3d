"""Bad command lines: exactly one line on stderr naming the problem, exit status 2, nothing
started. Plus --help and --dry_run, which start nothing either. (How fast a bad command line is
rejected is a speed question for bench/, not a pass criterion.)

WrongServerTest: an endpoint that names the wrong kind of server (an etcd for the gRPC backend, a
ddprun-rdzv for the etcd backend, an HTTP/1.1 server, a port that accepts and stays silent) says
what answers there, with exit 2 where the user must change the endpoint (issue #37 item 7)."""

import os
import socket
import threading
import time

import multinode_lib as ml
from etcd_cluster import EtcdCluster, etcd_available
from ddprun_testlib import DdprunTestCase, main


class BadInputTest(DdprunTestCase):
    def setUp(self):
        super().setUp()
        # Would leave a file behind if any worker ever started.
        self.prog = self.script("would_start.sh", 'touch "%s/started_$LOCAL_RANK"\nsleep 30\n' % self.tmp)
        self.plain = self.write_file("plain_file.sh", "#!/bin/sh\nexit 0\n")  # not executable

    def started(self):
        return [f for f in os.listdir(self.tmp) if f.startswith("started_")]

    def check_rejected(self, args, must_name, env=None):
        job = self.start(args, env=env)
        # A worker would sleep 30 s: a ddprun that started one instead of rejecting the command
        # line fails by the started_* file, or by the safety timeout.
        res = job.wait(why="a bad command line must be rejected before anything starts")
        self.assert_exit(res, 2)
        lines = res.stderr.splitlines()
        self.assertEqual(len(lines), 1, "expected exactly one line on stderr\n" + res.describe())
        for needle in must_name:
            self.assertIn(needle, lines[0], "the error does not name %r\n%s" % (needle, res.describe()))
        self.assert_no_crash_text(lines[0], res)
        self.assertEqual(self.started(), [], "a worker was started\n" + res.describe())
        self.assert_no_survivors(job, res, grace=0.5)

    def test_nproc_per_node(self):
        cases = [
            (["--nproc_per_node=0"], ["nproc_per_node", "0"]),
            (["--nproc_per_node=-1"], ["nproc_per_node", "-1"]),
            (["--nproc-per-node", "1025"], ["nproc", "1025"]),
            (["--nproc_per_node", "abc"], ["nproc_per_node", "abc"]),
        ]
        for flags, names in cases:
            with self.subTest(flags=flags):
                self.check_rejected(["--standalone"] + flags + [self.prog], names)

    def test_a_value_with_newlines_is_echoed_escaped_on_one_line(self):
        # A value with a newline must not forge a second line of ddprun's output (a log reader
        # would take "ddprun: error: ..." after it for ddprun's own words).
        for flags in (["--nproc_per_node", "4\nddprun: error: forged"], ["--rdzv_backend", "x\ry\nforged"],
                      ["--rdzv_id", "id\nforged"]):
            with self.subTest(flags=flags):
                self.check_rejected(["--standalone"] + flags + [self.prog], ["\\x0a"])

    def test_nproc_per_node_from_pet_variable(self):
        self.check_rejected(["--standalone", self.prog], ["abc"], env={"PET_NPROC_PER_NODE": "abc"})

    def test_nnodes(self):
        for value in ("3:2", "1:2:3", "0", "x"):
            with self.subTest(nnodes=value):
                self.check_rejected(["--standalone", "--nnodes=" + value, self.prog], ["nnodes", value])

    def test_master_port(self):
        self.check_rejected(["--master_port=70000", self.prog], ["master_port", "70000"])
        self.check_rejected(["--master-port", "0", self.prog], ["master_port", "0"])

    def test_other_numbers(self):
        self.check_rejected(["--standalone", "--max_restarts=-1", self.prog], ["max_restarts", "-1"])
        self.check_rejected(["--standalone", "--shutdown_timeout=soon", self.prog], ["shutdown_timeout", "soon"])
        self.check_rejected(["--standalone", "--redirects=5", self.prog], ["redirects", "5"])
        self.check_rejected(["--standalone", "--tee", "0:x", self.prog], ["tee", "0:x"])
        self.check_rejected(["--standalone", "--local_ranks_filter=a", self.prog], ["local_ranks_filter"])

    def test_other_values(self):
        self.check_rejected(["--standalone", "--signals_to_handle=SIGFOO", self.prog], ["SIGFOO"])
        self.check_rejected(["--standalone", "--log_line_prefix_template={bogus}", self.prog], ["{bogus}"])
        self.check_rejected(["--standalone", "--rdzv_backend=carrier-pigeon", self.prog], ["carrier-pigeon"])
        self.check_rejected(["--standalone", "--start_method=teleport", self.prog], ["teleport"])

    def test_unusable_log_dir(self):
        blocker = self.write_file("a_file", "not a folder\n")
        self.check_rejected(["--standalone", "--log_dir", os.path.join(blocker, "logs"), self.prog], [blocker])

    def test_missing_program(self):
        self.check_rejected(["--standalone", "--nproc_per_node=2"], ["PROGRAM"])

    def test_nonexistent_program(self):
        missing = self.path("no_such_program")
        self.check_rejected(["--standalone", missing], [missing])
        self.check_rejected(["--standalone", "no-such-command-for-ddprun-test"], ["no-such-command-for-ddprun-test"])
        missing_py = self.path("no_such_script.py")
        self.check_rejected(["--standalone", missing_py], [missing_py])

    def test_non_executable_program(self):
        self.check_rejected(["--standalone", self.plain], [self.plain])

    def test_directory_as_program(self):
        self.check_rejected(["--standalone", self.tmp], [self.tmp])

    def test_unknown_flag(self):
        self.check_rejected(["--standalone", "--bogus_flag", self.prog], ["--bogus_flag"])
        self.check_rejected(["--standalone", "--bogus_flag=3", self.prog], ["--bogus_flag"])

    def test_module_and_no_python_conflict(self):
        self.check_rejected(["--standalone", "-m", "--no_python", "json.tool"], ["no_python"])

    def test_help_starts_nothing(self):
        job = self.start(["--help"])
        res = job.wait()
        self.assert_exit(res, 0)
        self.assertIn("--nproc_per_node", res.stdout + res.stderr)
        self.assertEqual(self.started(), [])

    def test_an_unreadable_tls_file_of_a_joining_agent(self):
        # It used to abort: "terminate called after throwing an instance of 'ddprun::ConfigError'", 134.
        missing = self.path("nonexistent.pem")
        base = ["--nnodes=1", "--rdzv_backend=grpc", "--rdzv_endpoint=127.0.0.1:1", "--rdzv_id=x",
                "--nproc_per_node=1"]
        for conf in ("cacert=%s" % missing, "cert=%s,key=%s" % (missing, missing)):
            with self.subTest(conf=conf):
                self.check_rejected(base + ["--rdzv_conf=is_host=0,protocol=https," + conf, self.prog],
                                    [missing, "cannot read"])


class _Listener:
    """A loopback port whose every connection gets `answer` (None: nothing, held open) after the
    first bytes arrive; closed, with its connections, at the test's end."""

    def __init__(self, test, answer):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.held = []
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        test.addCleanup(self.close)

    def _serve(self):
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            if self.answer is not None:
                try:
                    conn.settimeout(2)
                    conn.recv(4096)
                    conn.sendall(self.answer)
                    conn.close()
                except OSError:
                    pass

    def close(self):
        self.stopping = True
        self.sock.close()
        for c in self.held:
            c.close()
        self.thread.join(5)


class WrongServerTest(DdprunTestCase):
    """The endpoint names a server, but not the rendezvous the backend speaks."""

    def setUp(self):
        super().setUp()
        self.prog = self.script("would_start.sh", 'touch "%s/started_$LOCAL_RANK"\nsleep 30\n' % self.tmp)

    def agent(self, backend, endpoint, join_timeout=20):
        return self.start(["--nnodes=1", "--rdzv_backend=" + backend, "--rdzv_endpoint=" + endpoint,
                           "--rdzv_id=wrong", "--nproc_per_node=1",
                           "--rdzv_conf=join_timeout=%d" % join_timeout, self.prog])

    def check_said_at_once(self, job, must_name, within_s):
        """Exit 2, one line naming each of must_name, well before the join timeout, nothing started."""
        res = job.wait(why="a wrong server must be told at once")
        self.assert_exit(res, 2)
        lines = res.stderr.splitlines()
        self.assertEqual(len(lines), 1, "expected exactly one line on stderr\n" + res.describe())
        for needle in must_name:
            self.assertIn(needle, lines[0], "the error does not name %r\n%s" % (needle, res.describe()))
        self.assert_no_crash_text(lines[0], res)
        self.assertLess(res.elapsed, within_s, "not said at once\n" + res.describe())
        self.assertEqual([f for f in os.listdir(self.tmp) if f.startswith("started_")], [])
        self.assert_no_survivors(job, res, grace=0.5)

    def test_the_etcd_backend_at_a_ddprun_rdzv(self):
        # It used to say "etcd get:" with an empty reason, exit 200.
        daemon = ml.Daemon(self, ml.free_port())
        job = self.agent("etcd", "127.0.0.1:%d" % daemon.port)
        self.check_said_at_once(job, ["127.0.0.1:%d" % daemon.port, "not an etcd", "ddprun rendezvous",
                                      "--rdzv_backend=grpc"], within_s=15)

    def test_the_grpc_backend_at_an_etcd(self):
        # It used to say "lost the rendezvous (unknown service ...); joining again", exit 200 after 10 s.
        reason = etcd_available()
        if reason:
            self.skipTest(reason)
        cluster = EtcdCluster(size=1)
        cluster.start()
        self.addCleanup(cluster.close)
        job = self.agent("grpc", cluster.endpoints[0])
        self.check_said_at_once(job, [cluster.endpoints[0], "not a ddprun rendezvous", "etcd",
                                      "--rdzv_backend=etcd"], within_s=8)

    def test_the_grpc_backend_at_an_http1_server(self):
        # It used to wait out the join timeout and say only "cannot reach ... within 20s", exit 200.
        server = _Listener(self, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        job = self.agent("grpc", "127.0.0.1:%d" % server.port)
        self.check_said_at_once(job, ["127.0.0.1:%d" % server.port, "HTTP/1.1", "not gRPC", "--rdzv_endpoint"],
                                within_s=15)

    def test_the_grpc_backend_at_a_silent_port(self):
        # Something accepts and never answers: perhaps a stuck rendezvous, so it is retried until
        # the join timeout (exit 200, infrastructure), but the last line says what was found there.
        server = _Listener(self, None)
        job = self.agent("grpc", "127.0.0.1:%d" % server.port, join_timeout=5)
        res = job.wait(why="the join timeout is 5 s")
        self.assert_exit(res, 200)
        last = res.stderr.strip().splitlines()[-1]
        for needle in ("cannot reach the rendezvous at 127.0.0.1:%d within 5s" % server.port,
                       "accepts connections but answers nothing", "--rdzv_endpoint"):
            self.assertIn(needle, last, "the error does not name %r\n%s" % (needle, res.describe()))
        self.assert_no_crash_text(res.stderr, res)
        self.assert_no_survivors(job, res, grace=0.5)


if __name__ == "__main__":
    main()
