"""The keys' coherence across tasks (:mod:`cl_lightning.metrics.key_coherence`), logged as the stream goes."""

from __future__ import annotations

import torch
from lightning.pytorch import Callback, Trainer

from cl_lightning.contract import EpisodeSource, KeyedLearner, require
from cl_lightning.metrics.key_coherence import cross_task_coherence


class KeyCoherenceMonitor(Callback):
    """Logs ``fast_weights/key_coherence`` after each evaluated task: the mean |cos| between the read keys (first
    head) of held-out queries of different tasks, over the task just trained and the ``window − 1`` before it, each
    task's keys made by the learner as it is now (none after the first evaluated task: no pair of tasks yet).

    Args:
        window: Evaluated tasks whose queries are compared (the last ``window`` up to the current one).
        queries_per_task: Held-out queries encoded per task (its first ones).
    """

    def __init__(self, window: int = 21, queries_per_task: int = 32) -> None:
        if window < 2 or queries_per_task < 1:
            raise ValueError(
                f"KeyCoherenceMonitor needs window >= 2 and queries_per_task >= 1, got {window} and {queries_per_task}"
            )
        self.window, self.queries_per_task = window, queries_per_task

    def on_fit_start(self, trainer: Trainer, pl_module: KeyedLearner) -> None:
        """Check that the learner reads with keys and the data module serves episodes (fails here, not after a task)."""
        require(pl_module, KeyedLearner, type(self).__name__)
        require(trainer.datamodule, EpisodeSource, type(self).__name__)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: KeyedLearner) -> None:
        """Log the coherence of the last ``window`` evaluated tasks' keys (none in a warm-up epoch)."""
        dm: EpisodeSource = trainer.datamodule
        task = dm.evaluated_task(trainer.current_epoch)
        if task is None or task == 0:
            return
        tasks = range(max(0, task - self.window + 1), task + 1)
        with torch.no_grad():
            keys = [pl_module.read_keys(dm.queries(t, self.queries_per_task)[0].to(pl_module.device)) for t in tasks]
        task_ids = torch.cat([torch.full((k.shape[1],), i, device=pl_module.device) for i, k in enumerate(keys)])
        coherence = cross_task_coherence(torch.cat(keys, dim=1)[0], task_ids)
        pl_module.log("fast_weights/key_coherence", coherence, on_step=False, on_epoch=True, batch_size=1)
