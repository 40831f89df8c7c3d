"""Hangs of C++ SDK workers (examples/train on libddp), with the flight recorder's attribution: every
collective a Communicator issues is recorded in a file the agent reads while the ranks hang
(DDPRUN_FLIGHT_RECORDER), and the failure summary names the rank that is behind and the
collective ("rank 1 never started all_reduce #N; rank 0 waits in it").

- gloo and the simulated NCCL runtime (tests/simgpu; skipped where it is not built): rank 1 stalls
  before a step's all-reduce; --hang_timeout finds it (its heartbeats stop), the line names it.
- seed 001 on the SDK (simulated NCCL): rank 1 exits 0 while rank 0 enters the all-reduce;
  --finish_timeout ends the job with 124 and the same kind of line.
The communicator's own timeout is 600 s here: only ddprun's detection ends these jobs in time."""

import os
import re

import e2e_lib as el

TEST_BIN = os.environ.get("DDPRUN_TEST_BIN") or os.path.join(os.path.dirname(el.BIN_DIR), "test-bin")
TRAIN = os.path.join(el.BIN_DIR, "train")
TRAIN_SIMGPU = os.path.join(TEST_BIN, "train_simgpu")
ARGS = ["--epochs", "50", "--samples", "512", "--timeout", "600"]


class SdkHangTest(el.E2ETestCase):
    def run_train(self, binary, flags, args):
        if not os.access(binary, os.X_OK):
            self.skipTest("%s is not built (train_simgpu: CMake option DDPRUN_SIMGPU)" % binary)
        return self.ddprun(["--standalone", "--nproc_per_node=2"] + flags, binary, ARGS + args,
                           env=self.base_env())

    def check_stalled(self, binary, backend):
        res = self.run_train(binary, ["--hang_timeout=2"], ["--backend", backend, "--stall_at_step", "7"])
        self.assertEqual(res.returncode, 124, res.describe())
        m = re.search(r"flight recorder: rank 1 never started all_reduce #(\d+)[^;\n]*; rank 0 waits in it",
                      res.stderr)
        self.assertTrue(m, res.describe())
        # Each rank's last collectives are listed under it.
        self.assertRegex(res.stderr, r"rank 1: #\d+ all_reduce [0-9.]+ [KM]?B completed", res.describe())

    def test_gloo_a_rank_stuck_before_a_collective_is_named(self):
        self.check_stalled(TRAIN, "gloo")

    def test_simulated_nccl_a_rank_stuck_before_a_collective_is_named(self):
        self.check_stalled(TRAIN_SIMGPU, "nccl")

    def test_seed_001_on_simulated_nccl_a_rank_that_left_is_named(self):
        # On gloo the peer's exit closes its sockets and the all-reduce fails at once; NCCL's waits.
        res = self.run_train(TRAIN_SIMGPU, ["--finish_timeout=2"], ["--backend", "nccl", "--leave_at_step", "5"])
        self.assertEqual(res.returncode, 124, res.describe())
        self.assertRegex(res.stderr, r"still running: rank 0\b", res.describe())
        self.assertRegex(res.stderr, r"flight recorder: rank 1 never started all_reduce #\d+", res.describe())
        self.assertIn("no Python stack (not a Python process)", res.stderr, res.describe())


if __name__ == "__main__":
    el.main()
