"""A PyTorch Lightning callback that beats once per training batch with the batch's step time (so
that stragglers are found) and marks validation and checkpoint saving as sections:

    from ddprun.lightning import DdprunCallback
    trainer = Trainer(callbacks=[DdprunCallback()])

Importing this module needs Lightning (`lightning` or `pytorch_lightning`); `import ddprun` alone
never does.
"""

import time

import ddprun

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback


class DdprunCallback(Callback):
    """Heartbeats from Lightning's training loop: ddprun.report_step with the global step and the
    rank's own work in the batch, measured from the end of the previous batch (its data loading
    included) to the start of the backward pass, where DDP's gradient all-reduce waits for the
    slower ranks (time spent waiting is the same on every rank and would hide a straggler).
    Validation is the section "validation"; saving a checkpoint is the section "checkpoint", from
    on_save_checkpoint (Lightning calls it just before it writes the file, and has no hook after)
    until the loop's next hook."""

    def __init__(self):
        super().__init__()
        self._validation = None
        self._checkpoint = None
        self._work_started = None  # when this batch's own work began (monotonic seconds)
        self._work_seconds = None  # the own work measured up to the backward pass

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._leave_checkpoint()
        if self._work_started is None:
            self._work_started = time.monotonic()

    def on_before_backward(self, trainer, pl_module, loss):
        if self._work_started is not None and self._work_seconds is None:
            self._work_seconds = time.monotonic() - self._work_started

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._leave_checkpoint()
        ddprun.report_step(trainer.global_step, self._work_seconds)
        self._work_seconds = None
        self._work_started = time.monotonic()  # the next batch's data loading is its own work

    def on_validation_start(self, trainer, pl_module):
        self._leave_checkpoint()
        self._work_started = None  # validation is not the next batch's work
        self._validation = ddprun.section("validation")
        self._validation.__enter__()

    def on_validation_end(self, trainer, pl_module):
        self._leave_checkpoint()  # sections nest: the inner one is left first
        if self._validation is not None:
            self._validation.__exit__(None, None, None)
            self._validation = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._work_started = None
        if self._checkpoint is None:  # a beat on entry restarts the agent's clock
            self._checkpoint = ddprun.section("checkpoint")
            self._checkpoint.__enter__()

    def on_train_end(self, trainer, pl_module):
        self._leave_checkpoint()

    def on_exception(self, trainer, pl_module, exception):
        self._leave_checkpoint()

    def _leave_checkpoint(self):
        if self._checkpoint is not None:
            self._checkpoint.__exit__(None, None, None)
            self._checkpoint = None
