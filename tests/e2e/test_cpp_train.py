"""The C++ example trainer (examples/train -> bin/train) under ddprun, as a user runs it.

- --standalone with 1, 2 and 4 workers (the file store): exit 0, the loss falls, the parameters
  move, and all three end with the same digest (the trainer splits one global batch over the
  ranks and averages gradients, so data-parallel training is the full-batch training).
- --max_restarts=1 with rank 1 crashing at the start of epoch 2: ddprun restarts the group, rank 0
  resumes from the checkpoint, and the digest equals the clean run's.
- 2 agents x 2 workers over the grpc rendezvous (RemoteStore over the real store service): the
  same digest again.
- --backend nccl (the model on the host, gradient buckets staged through device memory): with two
  GPUs (one per rank), the same digest as gloo at world size 2; without a GPU, a clear one-line
  refusal and exit 2, never a crash. Each of the two is reported skipped where it cannot run.
"""

import os
import re
import subprocess
import sys
import time
import uuid

import e2e_lib as el  # noqa: E402

TRAIN = os.path.join(el.BIN_DIR, "train")
TRAIN_ARGS = ["--epochs", "5", "--seed", "3"]
LOSS_RE = re.compile(r"\bepoch (\d+) loss ([0-9.]+)$", re.M)
DIGEST_RE = re.compile(r"^(?:\[[^\]]*\]:)?\s*digest ([0-9a-f]{16}) params_l2 ([0-9.]+)$", re.M)
START_RE = re.compile(r"\bstart_digest ([0-9a-f]{16}) params_l2 ([0-9.]+)$", re.M)


def gpu_count():
    """GPUs nvidia-smi lists; 0 when there is no nvidia-smi or no driver."""
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if res.returncode != 0:
        return 0
    return sum(1 for line in res.stdout.splitlines() if line.startswith("GPU "))


def parse(text):
    losses = [(int(e), float(v)) for e, v in LOSS_RE.findall(text)]
    digests = DIGEST_RE.findall(text)
    starts = START_RE.findall(text)
    return losses, digests, starts


class CppTrainTest(el.E2ETestCase):

    _clean = None  # the 4-worker clean run's digest, shared by the tests of one run

    def setUp(self):
        super().setUp()
        self.assertTrue(os.access(TRAIN, os.X_OK), "train not built at %s (build target 'train')" % TRAIN)

    def train(self, flags, args=()):
        res = self.ddprun(flags, TRAIN, TRAIN_ARGS + list(args))
        self.assertSucceeded(res)
        return res

    def check_training(self, res, world):
        losses, digests, starts = parse(res.stdout)
        self.assertEqual([e for e, _ in losses], [1, 2, 3, 4, 5], "one loss line per epoch\n" + res.describe())
        first, last = losses[0][1], losses[-1][1]
        self.assertLess(last, first / 2, "the loss did not fall by half\n" + res.describe())
        self.assertEqual(len(digests), 1, "rank 0 alone prints the digest\n" + res.describe())
        self.assertEqual(len(starts), 1, res.describe())
        self.assertNotEqual(starts[0][0], digests[0][0], "the parameters did not move\n" + res.describe())
        self.assertIn("world_size %d " % world, res.stdout, res.describe())
        sys.stderr.write("  [train] world %d: loss %.4f -> %.4f, digest %s, params_l2 %s (%.1fs)\n"
                         % (world, first, last, digests[0][0], digests[0][1], res.wall_s))
        return digests[0][0]

    def clean_digest(self):
        if CppTrainTest._clean is None:
            res = self.train(["--standalone", "--nproc_per_node=4"])
            CppTrainTest._clean = self.check_training(res, 4)
        return CppTrainTest._clean

    def test_standalone_1_2_4_workers_same_digest(self):
        digests = {}
        for world in (1, 2, 4):
            res = self.train(["--standalone", "--nproc_per_node=%d" % world])
            digests[world] = self.check_training(res, world)
        self.assertEqual(len(set(digests.values())), 1, "digests differ by world size: %s" % digests)
        CppTrainTest._clean = digests[4]

    def test_restart_resumes_from_checkpoint(self):
        expected = self.clean_digest()
        ckpt = os.path.join(self.tmp, "ckpt")
        res = self.train(["--standalone", "--nproc_per_node=4", "--max_restarts=1"],
                         ["--checkpoint", ckpt, "--crash_at_epoch", "2"])
        out = res.stdout + res.stderr
        self.assertIn("exiting with code 3", out, res.describe())
        self.assertRegex(res.stderr, r"(?i)restart", "ddprun did not report a restart\n" + res.describe())
        self.assertIn("resumed from epoch 2", res.stdout, res.describe())
        losses, digests, _ = parse(res.stdout)
        # Attempt 1 finished epoch 1; attempt 2 resumed and ran epochs 2..5.
        self.assertEqual([e for e, _ in losses], [1, 2, 3, 4, 5], res.describe())
        self.assertEqual(len(digests), 1, res.describe())
        self.assertEqual(digests[0][0], expected, "the resumed run ended elsewhere\n" + res.describe())
        self.assertTrue(os.path.exists(ckpt))

    def test_two_nodes_grpc_store_same_digest(self):
        expected = self.clean_digest()
        port = el.free_port()
        run_id = "cpp_train_" + uuid.uuid4().hex[:8]
        flags = ["--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=grpc",
                 "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_id=" + run_id, "--shutdown_timeout=2"]
        procs, files = [], []
        for tag in ("a", "b"):
            out = open(os.path.join(self.tmp, "node_%s.out" % tag), "w+")
            err = open(os.path.join(self.tmp, "node_%s.err" % tag), "w+")
            files.append((out, err))
            procs.append(subprocess.Popen([el.DDPRUN] + flags + [TRAIN] + TRAIN_ARGS, env=self.base_env(),
                                          stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=self.tmp,
                                          start_new_session=True))
            time.sleep(0.2)  # node a hosts the endpoint; b joins it
        start = time.monotonic()
        try:
            codes = [p.wait(timeout=el.RUN_TIMEOUT_S) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                    p.wait()
        texts = []
        for out, err in files:
            out.seek(0)
            err.seek(0)
            texts.append((out.read(), err.read()))
            out.close()
            err.close()
        describe = "\n".join("=== node %d exit %s ===\n%s\n--- stderr ---\n%s" % (i, codes[i], o[-3000:], e[-3000:])
                             for i, (o, e) in enumerate(texts))
        self.assertEqual(codes, [0, 0], describe)
        digests = [d for o, _ in texts for d in DIGEST_RE.findall(o)]
        self.assertEqual(len(digests), 1, "rank 0 alone prints the digest\n" + describe)
        self.assertEqual(digests[0][0], expected, "2x2 over grpc differs from standalone 4\n" + describe)
        self.assertTrue(any("world_size 4 " in o for o, _ in texts), describe)
        sys.stderr.write("  [train] 2 nodes x 2: digest %s (%.1fs)\n" % (digests[0][0], time.monotonic() - start))

    def test_nccl_backend_two_ranks_on_two_gpus_same_digest_as_gloo(self):
        # NCCL puts one rank on one device: a world of 2 needs two GPUs, and with one rank the
        # all-reduce would combine nothing.
        gpus = gpu_count()
        if gpus < 2:
            self.skipTest("needs two GPUs, one per rank; nvidia-smi lists %d" % gpus)
        flags = ["--standalone", "--nproc_per_node=2"]
        gloo = self.check_training(self.train(flags), 2)
        res = self.train(flags, ["--backend", "nccl"])
        self.assertIn("backend nccl ", res.stdout, res.describe())
        nccl = self.check_training(res, 2)
        self.assertEqual(nccl, gloo, "nccl and gloo trained to different parameters\n" + res.describe())

    def test_nccl_backend_without_gpu_exits_2_with_a_clear_refusal(self):
        gpus = gpu_count()
        if gpus > 0:
            self.skipTest("needs a machine without a GPU; nvidia-smi lists %d" % gpus)
        res = self.ddprun(["--standalone", "--nproc_per_node=2"], TRAIN, TRAIN_ARGS + ["--backend", "nccl"])
        out = res.stdout + res.stderr
        sys.stderr.write("  [train] no GPU: --backend nccl refused with exit %d\n" % res.returncode)
        self.assertEqual(res.returncode, 2, "the trainer's exit code for a bad environment\n" + res.describe())
        # "needs a CUDA device: <CUDA's message>", or "is not available: ..." in a build without NCCL.
        lines = re.findall(r"train: --backend nccl (?:needs a CUDA device: \S.*|is not available: \S.*)", out)
        self.assertTrue(lines, "no clear refusal\n" + res.describe())
        for crash in ("terminate called", "Traceback", "Segmentation fault", "core dumped", "Aborted", "what():"):
            self.assertNotIn(crash, out, res.describe())
        self.assertNotIn("epoch 1 loss", res.stdout, "trained without a device\n" + res.describe())

    def test_bad_flags_exit_2(self):
        direct = subprocess.run([TRAIN, "--epochs", "zero"], capture_output=True, text=True, timeout=30)
        self.assertEqual(direct.returncode, 2, direct.stderr)
        self.assertIn("--epochs expects a number", direct.stderr)
        direct = subprocess.run([TRAIN, "--frobnicate"], capture_output=True, text=True, timeout=30)
        self.assertEqual(direct.returncode, 2, direct.stderr)
        self.assertIn("unknown argument '--frobnicate'", direct.stderr)
        res = self.ddprun(["--standalone", "--nproc_per_node=1"], TRAIN, ["--epochs", "zero"])
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("--epochs expects a number", res.stdout + res.stderr, res.describe())
        res = self.ddprun(["--standalone", "--nproc_per_node=4"], TRAIN, ["--batch", "66"])
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("not divisible by the world size 4", res.stdout + res.stderr, res.describe())


if __name__ == "__main__":
    el.main()
