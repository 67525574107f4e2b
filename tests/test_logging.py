"""Task-mean logging equals Lightning's own epoch mean; the progress bar redraws no more often than asked."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import bare_trainer
from lightning.pytorch import Trainer

from cl_lightning.callbacks import TaskProgressBar
from cl_lightning.data import StreamDataModule, SyntheticClasses
from cl_lightning.data.stream import StreamBatch
from cl_lightning.learners import Backprop
from cl_lightning.learners.base import TaskMean
from cl_lightning.learners.engines import StepRun


class _BothWays(Backprop):
    """Logs the same weighted chunk values through Lightning (reference) and through the step run's task mean."""

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self._chunk = 0  # the chunk's index in its task (the batch index: one chunk per batch)

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> torch.Tensor:
        i, y = self._chunk, batch[1]
        self._chunk += 1
        n = 1 + i % 5  # unequal weights, so a plain mean of batch means would differ
        value = torch.tensor(float(i * i) + float(y[0]), dtype=torch.float32)
        self.log("ref/value", value, on_step=False, on_epoch=True, batch_size=n)
        run.log_task_mean("fast/value", value, n)
        return super().learn_chunk(batch, run)


def _trainer(tmp_path: Path, tasks: int) -> Trainer:
    return bare_trainer(tmp_path, tasks, limit_val_batches=0)


def test_task_mean_equals_lightnings_weighted_epoch_mean(tmp_path: Path) -> None:
    stream = SyntheticClasses(num_tasks=2, train_size=96, chunk_size=8)
    model = _BothWays(input_shape=stream.input_shape, num_outputs=stream.num_outputs, hidden_sizes=[8])
    trainer = _trainer(tmp_path, 2)
    trainer.fit(model, StreamDataModule(stream, context_size=8, eval_queries=8, num_probe_tasks=0))
    m = trainer.callback_metrics
    torch.testing.assert_close(m["fast/value"], m["ref/value"])
    # the second task's mean only (the first task's sums were reset): weights 1..5 over batch indices 0..11
    ys = [int(stream.chunk(1, i)[1][0]) for i in range(12)]
    w = torch.tensor([1 + i % 5 for i in range(12)], dtype=torch.float64)
    v = torch.tensor([i * i + ys[i] for i in range(12)], dtype=torch.float64)
    torch.testing.assert_close(m["fast/value"].double(), (w * v).sum() / w.sum(), rtol=1e-6, atol=1e-6)
    assert model._task_means == {}


def test_progress_bar_redraws_at_most_every_min_interval() -> None:
    bar = TaskProgressBar(min_interval=3600.0)
    assert bar._should_update(1, 100)  # the first redraw is free
    assert not any(bar._should_update(n, 100) for n in range(2, 100))  # then none within the hour
    assert bar._should_update(100, 100)  # but a task's last chunk always shows
    every = TaskProgressBar(min_interval=0.0, refresh_rate=10)
    assert [n for n in range(1, 31) if every._should_update(n, 30)] == [10, 20, 30]


def test_task_mean_is_weighted_and_keeps_a_nan() -> None:
    mean = TaskMean()
    mean.update(torch.tensor(1.0), 1)
    mean.update(torch.tensor(3.0), 3)
    assert float(mean.compute()) == 2.5
    mean.update(torch.tensor(float("nan")), 2)  # a diverged loss must show, not vanish from the mean
    assert torch.isnan(mean.compute())
