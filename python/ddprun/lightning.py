"""A PyTorch Lightning callback that beats once per training batch and marks validation and
checkpoint saving as sections:

    from ddprun.lightning import DdprunCallback
    trainer = Trainer(callbacks=[DdprunCallback()])

Importing this module needs Lightning (`lightning` or `pytorch_lightning`); `import ddprun` alone
never does.
"""

import ddprun

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback


class DdprunCallback(Callback):
    """Heartbeats from Lightning's training loop (ddprun.report_step with the global step)."""

    def __init__(self):
        super().__init__()
        self._validation = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        ddprun.report_step(trainer.global_step)

    def on_validation_start(self, trainer, pl_module):
        self._validation = ddprun.section("validation")
        self._validation.__enter__()

    def on_validation_end(self, trainer, pl_module):
        if self._validation is not None:
            self._validation.__exit__(None, None, None)
            self._validation = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        ddprun.heartbeat()  # saving happens next: a beat just before it restarts the clock
