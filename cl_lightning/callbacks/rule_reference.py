"""The P1 probe's references (:mod:`cl_lightning.metrics.rule_reference`), logged beside the learner's scores.

The references are not learners (no memory across tasks, nothing trained), so a monitor measures them on the stream,
like a cost; every run of a suite logs them for its stream and seed, and the report reads them from any of its runs.
"""

from __future__ import annotations

import torch
from lightning.pytorch import Callback, Trainer

from cl_lightning.contract import ObservedLearner, WrittenKeysSource, require
from cl_lightning.metrics.rule_reference import least_squares_accuracy, nearest_pair_accuracy


class RuleReferenceMonitor(Callback):
    """Logs, after each evaluated task, the two references on the task's held-out queries (the data module's
    ``eval_queries``): ``reference/least_squares_acc`` (from the task's training examples) and
    ``reference/nearest_pair_acc`` (from its written keys).

    Cost knob: none needed (one ``lstsq`` of the task's examples and one distance matrix per task).
    """

    def on_fit_start(self, trainer: Trainer, pl_module: ObservedLearner) -> None:
        """Check that the data module serves written keys (a stream that writes none fails here, not after a task)."""
        require(trainer.datamodule, WrittenKeysSource, type(self).__name__)
        trainer.datamodule.written_episode(0)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: ObservedLearner) -> None:
        """Log both references for the task just trained (none after a warm-up task)."""
        dm: WrittenKeysSource = trainer.datamodule
        task = dm.evaluated_task(trainer.current_epoch)
        if task is None:
            return
        batches = list(dm.task_batches(trainer.current_epoch))
        x, y = torch.cat([b.x for b in batches]), torch.cat([b.y for b in batches])  # the task's training examples
        qx, qy = dm.queries(task, dm.eval_queries)
        written = dm.written_episode(task)
        log = {
            "reference/least_squares_acc": least_squares_accuracy(x, y, qx, qy, dm.num_outputs),
            "reference/nearest_pair_acc": nearest_pair_accuracy(written.query_x, written.query_y, qx, qy),
        }
        for name, value in log.items():
            pl_module.log(name, value.to(pl_module.device), on_step=False, on_epoch=True, batch_size=1)
