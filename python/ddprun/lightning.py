"""A PyTorch Lightning callback that beats once per training batch with the batch's step time (so
that stragglers are found) and marks validation and checkpoint saving as sections:

    from ddprun.lightning import DdprunCallback
    trainer = Trainer(callbacks=[DdprunCallback()])

Importing this module needs Lightning (`lightning` or `pytorch_lightning`); `import ddprun` alone
never does. Per batch the callback costs two monotonic clock reads and one ddprun.report_step;
outside ddprun it sends nothing, and it never raises into the training loop (ddprun's calls do not).
"""

import time
from typing import Any, ContextManager, Dict, Optional

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
    until the loop's next hook. What follows the last batch (on_train_end's work, Lightning's
    teardown, the script's own epilogue) is the section "teardown", until training starts again or
    the process ends: under --hang_timeout=auto it is not judged by the training loop's bound.

    Trainer and module are typed Any: the hooks read only trainer.global_step, and Lightning's
    classes come from either package name."""

    def __init__(self) -> None:
        super().__init__()
        self._validation: Optional[ContextManager[None]] = None
        self._checkpoint: Optional[ContextManager[None]] = None
        self._teardown: Optional[ContextManager[None]] = None
        self._work_started: Optional[float] = None  # when this batch's own work began (monotonic seconds)
        self._work_seconds: Optional[float] = None  # the own work measured up to the backward pass

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """Leaves the checkpoint section, if open; starts timing the batch's own work."""
        self._leave_checkpoint()
        if self._work_started is None:
            self._work_started = time.monotonic()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """Ends the batch's own work: what follows waits for the slower ranks."""
        if self._work_started is not None and self._work_seconds is None:
            self._work_seconds = time.monotonic() - self._work_started

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Leaves the checkpoint section, if open; ddprun.report_step(global_step, own work)."""
        self._leave_checkpoint()
        ddprun.report_step(trainer.global_step, self._work_seconds)
        self._work_seconds = None
        self._work_started = time.monotonic()  # the next batch's data loading is its own work

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """Enters the section "validation" (not timed as a batch's work)."""
        self._leave_checkpoint()
        self._work_started = None  # validation is not the next batch's work
        self._validation = ddprun.section("validation")
        self._validation.__enter__()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Leaves the section "validation" (and a checkpoint section inside it first)."""
        self._leave_checkpoint()  # sections nest: the inner one is left first
        if self._validation is not None:
            self._validation.__exit__(None, None, None)
            self._validation = None

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        """Enters the section "checkpoint", left at the loop's next hook."""
        self._work_started = None
        if self._checkpoint is None:  # a beat on entry restarts the agent's clock
            self._checkpoint = ddprun.section("checkpoint")
            self._checkpoint.__enter__()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Leaves the teardown section of an earlier fit, if open."""
        if self._teardown is not None:
            self._teardown.__exit__(None, None, None)
            self._teardown = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Leaves the checkpoint section, if open, and enters "teardown" (one beat)."""
        self._leave_checkpoint()
        if self._teardown is None:
            self._teardown = ddprun.section("teardown")
            self._teardown.__enter__()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Leaves the checkpoint section, if open."""
        self._leave_checkpoint()

    def _leave_checkpoint(self) -> None:
        if self._checkpoint is not None:
            self._checkpoint.__exit__(None, None, None)
            self._checkpoint = None
