"""The C++ trainer's NCCL path under ddprun on simulated GPUs (tests/simgpu, docs/simgpu.md):
train_simgpu is examples/train linked to libddp's NCCL backend over simgpu instead of the real
CUDA runtime and NCCL, so the ranks are real processes that meet through the ncclUniqueId.

- 4 workers on 4 simulated devices: the same losses and digest as --backend gloo (the trainer's
  gradients are on a 2^-17 fixed-point grid and NCCL's average pre-multiplies by 1/4, exact in
  float, so the sums are exact in any order: no tolerance), and each local rank touched only its
  own device (never device 0 for local ranks 1..3).
- a collective that hangs on rank 1: the communicator's watchdog aborts it within the timeout and
  the error names the collective, the rank and the time; ddprun reports the failure.
- an asynchronous NCCL error on rank 2 with --max_restarts=1: the group is restarted and the
  second attempt (no fault: simgpu faults fire in the first attempt only) ends with the clean digest.
- one visible device for two local ranks: a clear error naming LOCAL_RANK and
  --virtual_local_rank; with --virtual_local_rank each worker gets its own device and trains.
"""

import os
import re
import sys

import e2e_lib as el  # noqa: E402

TEST_BIN = os.environ.get("DDPRUN_TEST_BIN") or os.path.join(os.path.dirname(el.BIN_DIR), "test-bin")
TRAIN = os.path.join(TEST_BIN, "train_simgpu")
# Fewer samples than the gloo tests: 4 ranks on 2 shared cores, every collective through files.
TRAIN_ARGS = ["--epochs", "3", "--seed", "3", "--samples", "1024"]
LOSS_RE = re.compile(r"\bepoch (\d+) loss ([0-9.]+)$", re.M)
DIGEST_RE = re.compile(r"^(?:\[[^\]]*\]:)?\s*digest ([0-9a-f]{16}) params_l2 ([0-9.]+)$", re.M)
REPORT_RE = re.compile(r"^pid=\d+ rank=(\S+) local_rank=(\S+) touched=(\S+) implicit_device0_calls=(\d+)$", re.M)


class SimgpuTrainTest(el.E2ETestCase):

    def setUp(self):
        super().setUp()
        if not os.access(TRAIN, os.X_OK):
            self.skipTest("train_simgpu not built at %s (CMake option DDPRUN_SIMGPU: needs the CUDA and NCCL "
                          "headers)" % TRAIN)

    def run_train(self, flags, args=(), **env):
        report = os.path.join(self.tmp, "simgpu_report_%d.txt" % len(os.listdir(self.tmp)))
        full_env = self.base_env(DDPRUN_SIMGPU_REPORT=report, **env)
        res = self.ddprun(flags, TRAIN, TRAIN_ARGS + list(args), env=full_env)
        lines = []
        if os.path.exists(report):
            with open(report) as f:
                lines = REPORT_RE.findall(f.read())
        return res, lines

    def losses_and_digest(self, res):
        losses = LOSS_RE.findall(res.stdout)
        digests = DIGEST_RE.findall(res.stdout)
        self.assertEqual([int(e) for e, _ in losses], [1, 2, 3], res.describe())
        self.assertEqual(len(digests), 1, res.describe())
        return [v for _, v in losses], digests[0][0]

    def test_nccl_on_4_simulated_devices_same_losses_and_digest_as_gloo(self):
        flags = ["--standalone", "--nproc_per_node=4"]
        gloo, _ = self.run_train(flags)
        self.assertSucceeded(gloo)
        nccl, report = self.run_train(flags, ["--backend", "nccl"])
        self.assertSucceeded(nccl)
        self.assertIn("backend nccl ", nccl.stdout, nccl.describe())
        self.assertEqual(self.losses_and_digest(nccl), self.losses_and_digest(gloo),
                         "nccl on simgpu and gloo trained differently\n" + nccl.describe())
        self.assertEqual(len(report), 4, "one simgpu report line per worker: %s\n%s" % (report, nccl.describe()))
        for rank, local, touched, implicit in report:
            self.assertEqual(touched, local, "local rank %s touched devices %s" % (local, touched))
            self.assertEqual(implicit, "0", "local rank %s made a context on device 0 implicitly" % local)
        sys.stderr.write("  [simgpu] 4 ranks: nccl digest %s = gloo (%.1fs)\n"
                         % (self.losses_and_digest(nccl)[1], nccl.wall_s))

    def test_hung_collective_is_aborted_within_the_timeout_with_a_named_error(self):
        res, _ = self.run_train(["--standalone", "--nproc_per_node=2"], ["--backend", "nccl", "--timeout", "3"],
                                DDPRUN_SIMGPU_HANG_COLLECTIVE="5", DDPRUN_SIMGPU_FAULT_RANK="1")
        out = res.stdout + res.stderr
        self.assertEqual(res.returncode, 1, "the trainer's exit code for a runtime failure\n" + res.describe())
        # Rank 1 hangs; rank 0 waits for it. Whichever times out first is reported (ddprun then
        # stops the other), each naming its own collective, rank and device.
        self.assertRegex(out, r"train \(rank (\d)\): nccl allReduce #5 \(rank \1 of 2, device \1\) timed out: "
                              r"not complete after \d+ ms \(timeout 3000 ms\); the communicator was aborted",
                         res.describe())
        for crash in ("terminate called", "Segmentation fault", "core dumped"):
            self.assertNotIn(crash, out, res.describe())

    def test_async_error_restarts_the_group_and_the_second_attempt_trains_clean(self):
        flags = ["--standalone", "--nproc_per_node=4"]
        clean, _ = self.run_train(flags, ["--backend", "nccl"])
        self.assertSucceeded(clean)
        res, _ = self.run_train(flags + ["--max_restarts=1"], ["--backend", "nccl", "--timeout", "60"],
                                DDPRUN_SIMGPU_ASYNC_ERROR="3", DDPRUN_SIMGPU_FAULT_RANK="2")
        self.assertSucceeded(res)
        self.assertIn("remote process exited or there was a network error", res.stdout + res.stderr, res.describe())
        self.assertRegex(res.stderr, r"(?i)restart", "ddprun did not report a restart\n" + res.describe())
        self.assertEqual(self.losses_and_digest(res), self.losses_and_digest(clean), res.describe())

    def test_one_visible_device_for_two_local_ranks_is_a_clear_error_unless_virtual_local_rank(self):
        res, _ = self.run_train(["--standalone", "--nproc_per_node=2"], ["--backend", "nccl"],
                                CUDA_VISIBLE_DEVICES="0")
        out = res.stdout + res.stderr
        self.assertNotEqual(res.returncode, 0, res.describe())
        self.assertRegex(out, r"LOCAL_RANK=1 of LOCAL_WORLD_SIZE=2 has no CUDA device of its own: 1 visible "
                              r"\(CUDA_VISIBLE_DEVICES='0'\).*--virtual_local_rank", res.describe())
        self.assertNotIn("Duplicate GPU", out, res.describe())

        flags = ["--standalone", "--nproc_per_node=2"]
        gloo, _ = self.run_train(flags)
        self.assertSucceeded(gloo)
        virtual, report = self.run_train(flags + ["--virtual_local_rank"], ["--backend", "nccl"],
                                         CUDA_VISIBLE_DEVICES="2,3")
        self.assertSucceeded(virtual)
        self.assertEqual(self.losses_and_digest(virtual), self.losses_and_digest(gloo), virtual.describe())
        # Every worker has LOCAL_RANK=0 and sees one device; simgpu reports the physical one.
        self.assertEqual(sorted(t for _, _, t, _ in report), ["2", "3"], report)


if __name__ == "__main__":
    el.main()
