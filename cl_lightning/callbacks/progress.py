"""A progress bar that counts tasks: "Task 12/7500" with the whole run's ETA beside the per-task bar."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar


class TaskProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar, labelled by task, with an ETA for the remaining tasks from the mean task time.

    Redraws are throttled by time as well as by count: a chunk-1 stream (slowly changing regression) steps about
    every millisecond.

    Args:
        refresh_rate: Update the bar at most every this many chunks.
        leave: Keep each task's bar on screen when it finishes.
        min_interval: Update the bar at most every this many seconds (and always at a task's last chunk).
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, min_interval: float = 0.1) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self.min_interval = min_interval
        self._fit_start = 0.0
        self._first_epoch = 0
        self._last_draw = float("-inf")

    def _should_update(self, current: int, total: int) -> bool:
        """Lightning's count rule, and no sooner than ``min_interval`` after the last redraw (the last chunk always)."""
        if not super()._should_update(current, total):
            return False
        now = time.monotonic()
        if current != total and now - self._last_draw < self.min_interval:
            return False
        self._last_draw = now
        return True

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Remember when (and at which task, after a resume) the run started."""
        super().on_train_start(trainer, pl_module)
        self._fit_start = time.monotonic()
        self._first_epoch = trainer.current_epoch

    def eta(self, trainer: Trainer) -> str:
        """Estimated time for the remaining tasks, from the mean time of the tasks finished so far."""
        done = trainer.current_epoch - self._first_epoch
        if done <= 0 or trainer.max_epochs is None:
            return "?"
        per_task = (time.monotonic() - self._fit_start) / done
        return str(timedelta(seconds=round(per_task * (trainer.max_epochs - trainer.current_epoch))))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Relabel the bar for the new task."""
        super().on_train_epoch_start(trainer, pl_module)
        self.train_progress_bar.set_description(f"Task {trainer.current_epoch + 1}/{trainer.max_epochs}")

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        """Lightning's metrics plus the run's ETA."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        metrics["run_eta"] = self.eta(trainer)
        return metrics
