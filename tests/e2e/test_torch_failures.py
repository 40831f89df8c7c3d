"""PyTorch workers that fail, under ddprun.

(a) Rank 1 raises inside a function decorated with torchelastic's @record (which writes the
    exception to TORCHELASTIC_ERROR_FILE) while rank 0 waits in a barrier: ddprun stops rank 0,
    exits with 1 (rank 1's exit code; torchrun exits 1 too), and its failure summary names rank 1
    and quotes the message from the error file.
(b) With --max_restarts=1, rank 1 dies in the middle of training on the first attempt only
    (TORCHELASTIC_RESTART_COUNT == "0"): the group restarts, trains to completion, exits 0, and
    ends with the same weights as a clean run.
(c) The same script with --max_restarts=0 is not restarted: exit 1, the summary names rank 1.
"""

import os
import re
import uuid

import e2e_lib
from e2e_lib import DDP_TRAIN, E2ETestCase, read_json, summary_block, worker

ATOL = 1e-5  # as in test_torch_ddp; the restarted run repeats the clean run's arithmetic exactly
EPOCHS = 4
MAX_FAILURE_WALL_S = 60  # a failure is handled at once, never by waiting out a collective timeout


class TorchFailureTest(E2ETestCase):

    def test_record_error_file_message_in_summary(self):
        token = uuid.uuid4().hex[:12]
        message = "RuntimeError: rank 1 found a corrupt shard (token %s)" % token
        result = self.ddprun(["--standalone", "--nproc_per_node=2"], worker("raise_on_rank1.py"), [token])
        self.assertEqual(result.returncode, 1, result.describe())
        self.assertEqual(result.leaked, [], result.describe())
        self.assertLess(result.wall_s, MAX_FAILURE_WALL_S, result.describe())
        self.assertNotIn("got past the barrier", result.stdout)

        block = summary_block(result.stderr)
        self.assertTrue(block, "no failure summary on stderr\n" + result.describe())
        self.assertRegex(block, r"(?m)^\s*rank\s*:\s*1\b", "the summary must name rank 1 as the root cause")
        self.assertNotRegex(block, r"(?m)^\s*rank\s*:\s*0\b")
        self.assertRegex(block, r"(?m)^\s*exitcode\s*:\s*1\b")
        # The message line is the error file's "message" field (torchelastic writes
        # "<ExceptionType>: <text>"), and the summary says which file it read.
        self.assertRegex(block, r"(?m)^\s*message\s*:\s*%s\s*$" % re.escape(message), block)
        error_file = re.search(r"(?m)^\s*error_file\s*:\s*(\S+)\s*$", block)
        self.assertIsNotNone(error_file, block)
        # Attempt 0, local rank 1: flat in ddprun's own temporary folder (no --log_dir here;
        # docs/supervision.md), attempt_0/1/error.json under a --log_dir as torchrun lays it out.
        self.assertEqual(os.path.basename(error_file.group(1)), "attempt_0.1.error.json", block)

        # torchrun, on the same script, agrees on the exit status and the failing rank.
        peer = self.torchrun(["--standalone", "--nproc_per_node=2", "--monitor_interval", "0.1"],
                             worker("raise_on_rank1.py"), [token])
        self.assertEqual(peer.returncode, result.returncode, peer.describe())
        self.assertRegex(peer.stderr, r"rank\s*:\s*1 \(local_rank: 1\)", peer.describe())

    def clean_weights(self):
        out = os.path.join(self.tmp, "clean.pt")
        result = self.ddprun(["--standalone", "--nproc_per_node=2"], DDP_TRAIN, ["--out", out, "--epochs", str(EPOCHS)])
        self.assertSucceeded(result)
        return read_json(out + ".json")

    def test_restart_after_crash_on_first_attempt(self):
        clean = self.clean_weights()
        out = os.path.join(self.tmp, "restarted.pt")
        result = self.ddprun(["--standalone", "--nproc_per_node=2", "--max_restarts=1"],
                             worker("crash_once_then_train.py"), ["--out", out, "--epochs", str(EPOCHS)])
        self.assertSucceeded(result)
        self.assertIn("simulated crash of rank 1 after epoch 2", result.stderr, result.describe())
        # Attempt 0 printed epochs 0-2 before rank 1 died (the line of epoch 2 races with the
        # crash: rank 0 prints it just as rank 1 raises); attempt 1 printed them all.
        epochs = [int(e) for e in re.findall(r"epoch (\d+) loss", result.stdout)]
        self.assertIn(epochs, ([0, 1] + list(range(EPOCHS)), [0, 1, 2] + list(range(EPOCHS))), result.describe())

        summary = read_json(out + ".json")
        self.assertEqual(summary["restart_count"], "1", "the final weights must come from the restarted group")
        self.assertEqual(summary["world_size"], 2)
        diff = max(abs(a - b) for a, b in zip(summary["final_weights"], clean["final_weights"]))
        self.assertEqual(len(summary["final_weights"]), len(clean["final_weights"]))
        self.assertLessEqual(diff, ATOL, "restarted run ends %.3g away from the clean run" % diff)
        moved = max(abs(a - b) for a, b in zip(summary["final_weights"], summary["initial_weights"]))
        self.assertGreater(moved, 100 * ATOL, "training did not change the weights")

    def test_no_restart_without_budget(self):
        out = os.path.join(self.tmp, "norestart.pt")
        result = self.ddprun(["--standalone", "--nproc_per_node=2", "--max_restarts=0"],
                             worker("crash_once_then_train.py"), ["--out", out, "--epochs", str(EPOCHS)])
        self.assertEqual(result.returncode, 1, result.describe())
        self.assertEqual(result.leaked, [], result.describe())
        self.assertLess(result.wall_s, MAX_FAILURE_WALL_S, result.describe())
        self.assertFalse(os.path.exists(out + ".json"), "the job was restarted or went on after the crash")
        self.assertIn([int(e) for e in re.findall(r"epoch (\d+) loss", result.stdout)], ([0, 1], [0, 1, 2]))
        block = summary_block(result.stderr)
        self.assertRegex(block, r"(?m)^\s*rank\s*:\s*1\b", result.describe())
        # No @record here, so no error file: the summary quotes rank 1's stderr instead.
        self.assertIn("simulated crash of rank 1 after epoch 2", block)


if __name__ == "__main__":
    e2e_lib.main()
