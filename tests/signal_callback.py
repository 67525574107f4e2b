"""A test-only callback for ``python -m cl_lightning fit`` in a subprocess (``tests/`` on its ``PYTHONPATH``):
``--trainer.callbacks+=signal_callback.SignalAfterFit --trainer.callbacks.signum=15 --trainer.callbacks.marker=F``.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer


class SignalAfterFit(Callback):
    """Sends its own process ``signum`` after the run's last step, then marks the end of ``Trainer.fit``.

    Args:
        signum: the signal sent from ``on_train_end`` (just after "``Trainer.fit`` stopped: ``max_epochs`` reached";
            Lightning's own teardown, which puts back the handlers it replaced, is still to come).
        marker: a file created from ``teardown`` (the last hook of ``fit``): from then on the test sends more.
    """

    def __init__(self, signum: int, marker: str) -> None:
        self.signum = signum
        self.marker = marker

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Signal this process once the last task is done."""
        os.kill(os.getpid(), self.signum)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Mark the end of ``fit``."""
        if stage == "fit":
            Path(self.marker).touch()


class SignalAtLastTaskEnd(Callback):
    """Sends its own process ``signum`` as the last task ends (``on_train_epoch_end`` of the last epoch): after its
    final evaluation, before Lightning's fit loop closes the epoch, which checks for a SIGTERM once more.

    Args:
        signum: the signal to send.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Signal this process in the last task."""
        if trainer.current_epoch + 1 == trainer.max_epochs:
            os.kill(os.getpid(), self.signum)


class SignalAtEvaluation(Callback):
    """Sends its own process ``signum`` as the first batch of ``validate`` / ``test`` starts.

    Args:
        signum: the signal to send.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def _signal(self, batch_idx: int) -> None:
        if batch_idx == 0:
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Signal this process at the first ``validate`` batch."""
        if not trainer.training:
            self._signal(batch_idx)

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Signal this process at the first ``test`` batch."""
        self._signal(batch_idx)


class SignalInTask(Callback):
    """Sends its own process ``signum`` as the first training batch of ``task`` (0-based) starts.

    Args:
        signum: the signal to send.
        task: the task (epoch) in which to send it.
    """

    def __init__(self, signum: int, task: int) -> None:
        self.signum, self.task = signum, task

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: object, idx: int) -> None:
        """Signal this process once, in its task."""
        if trainer.current_epoch == self.task and idx == 0:
            os.kill(os.getpid(), self.signum)
