"""Worker for test_torch_failures: examples/torch/ddp_train.py, except that on the first attempt
(TORCHELASTIC_RESTART_COUNT == "0") rank 1 dies in the middle of training, after epoch
CRASH_EPOCH. On a restart it trains to completion like the clean script.
Usage: crash_once_then_train.py [ddp_train.py arguments]"""

import importlib.util
import os

# The example itself, from the checkout (a worker runs with whatever environment its test gave).
_EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "torch", "ddp_train.py")
_spec = importlib.util.spec_from_file_location("ddp_train", _EXAMPLE)
ddp_train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ddp_train)

CRASH_EPOCH = 2


def crash_on_first_attempt(epoch, loss):
    if epoch == CRASH_EPOCH and os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        raise RuntimeError("simulated crash of rank 1 after epoch %d (loss %.6f)" % (epoch, loss))


if __name__ == "__main__":
    ddp_train.train(ddp_train.parse_args(), on_epoch_end=crash_on_first_attempt)
