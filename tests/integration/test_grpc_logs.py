"""gRPC's own log lines: in ddprun's log at debug level, or, when the user sets GRPC_VERBOSITY (and
GRPC_TRACE) as gRPC documents, on stderr from gRPC itself. A session chasing a lost connection
needed gRPC's keepalive trace and got nothing: the lines went to a debug log nobody had on."""

import os
import time

import ddprun_testlib as tl
import multinode_lib as ml
import ports
from ddprun_testlib import main


class GrpcLogsTest(tl.DdprunTestCase):
    def daemon_stderr(self, env):
        port = ports.free_port()
        proc = ml.Proc(self, [ml.RDZV, "--port", str(port), "--bind", "127.0.0.1"], env=env, name="rdzv")
        deadline = time.monotonic() + 15
        while "listening on" not in proc.stdout():
            self.assertIsNone(proc.poll(), proc.result(proc.poll()).describe())
            self.assertLess(time.monotonic(), deadline, "ddprun-rdzv did not start")
            time.sleep(0.02)
        proc.kill()
        proc.wait(30)
        return proc.stderr()

    def test_grpc_verbosity_shows_grpcs_own_lines(self):
        # The api tracer logs each call into gRPC's core, grpc_server_start among them, at INFO.
        err = self.daemon_stderr(ml.clean_env({"GRPC_VERBOSITY": "INFO", "GRPC_TRACE": "api"}))
        self.assertIn("grpc_server_start", err)
        err = self.daemon_stderr(ml.clean_env({"GRPC_VERBOSITY": None, "GRPC_TRACE": "api"}))
        self.assertNotIn("grpc_server_start", err)


if __name__ == "__main__":
    main()
