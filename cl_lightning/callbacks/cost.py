"""A learner's memory and time per task: context-memory bytes, seconds per training step (docs/metrics.md §5)."""

from __future__ import annotations

import time
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer

from cl_lightning.contract import ObservedLearner, steps_in
from cl_lightning.memory.accounting import Precision, memory_bytes, stream_row_bytes, tensor_bytes


class CostMonitor(Callback):
    """Logs, at each task's end, ``memory/context_bytes``, ``memory/param_bytes``, ``memory/budget_bytes`` (what a
    budget study charges, :func:`~cl_lightning.memory.accounting.memory_bytes`), ``cost/step_seconds`` and
    ``cost/task_seconds`` (docs/metrics.md §5: what each counts). Cost knob: none needed (two clock reads per step).

    Args:
        row_precision: How ``memory/budget_bytes`` charges a buffer row: as stored (``"stored"``: float32 inputs,
            int64 label and task id) or at the data's own precision (``"data"``: 8-bit pixels, a 1-byte label).
    """

    def __init__(self, row_precision: Precision = "stored") -> None:
        self.row_precision = row_precision
        self._start: float | None = None
        self._end = 0.0
        self._steps = 0

    def on_train_epoch_start(self, trainer: Trainer, pl_module: ObservedLearner) -> None:
        """Reset the task's clock."""
        self._start, self._steps = None, 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: ObservedLearner, batch: Any, batch_idx: int) -> None:
        """Start the clock at the task's first step."""
        if self._start is None:
            self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: ObservedLearner, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Count the step and stop the clock (synchronising CUDA once, at the task's last step)."""
        if batch_idx == trainer.num_training_batches - 1 and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self._steps += steps_in(batch)  # a StreamSteps batch holds several steps
        self._end = time.perf_counter()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: ObservedLearner) -> None:
        """Log the task's memory and time per step."""
        stream = getattr(trainer.datamodule, "stream", None)
        row = stream_row_bytes(stream, self.row_precision) if stream is not None else None
        log = {
            "memory/context_bytes": float(pl_module.context_memory_bytes()),
            "memory/param_bytes": float(tensor_bytes(pl_module.parameters())),
            "memory/budget_bytes": float(memory_bytes(pl_module, row).budget),
        }
        if self._start is not None and self._steps:
            seconds = self._end - self._start
            log |= {"cost/step_seconds": seconds / self._steps, "cost/task_seconds": seconds}
        for name, value in log.items():
            pl_module.log(name, torch.tensor(value, dtype=torch.float64), on_step=False, on_epoch=True, batch_size=1)
