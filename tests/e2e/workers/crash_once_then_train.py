"""Worker for test_torch_failures: examples/torch/ddp_train.py, except that on the first attempt
(TORCHELASTIC_RESTART_COUNT == "0") rank 1 dies in the middle of training, after epoch
CRASH_EPOCH. On a restart it trains to completion like the clean script.
Usage: crash_once_then_train.py [ddp_train.py arguments]"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "examples", "torch"))

import ddp_train  # noqa: E402

CRASH_EPOCH = 2


def crash_on_first_attempt(epoch, loss):
    if epoch == CRASH_EPOCH and os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        raise RuntimeError("simulated crash of rank 1 after epoch %d (loss %.6f)" % (epoch, loss))


if __name__ == "__main__":
    ddp_train.train(ddp_train.parse_args(), on_epoch_end=crash_on_first_attempt)
