"""What the monitors share when they probe a learner: the task due, its evaluation episode, eval mode, the contract.

Helpers, not callbacks: ``ForgettingMonitor``, ``PlasticityMonitor`` and ``HessianMonitor`` import them from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from lightning.pytorch import Trainer
from torch import Tensor, nn

from cl_lightning.contract import EpisodeSource, ObservedLearner, require


@contextmanager
def evaluation_mode(module: nn.Module) -> Iterator[None]:
    """Run a block in eval mode without gradients, then give every submodule back its own previous mode."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


def due_task(trainer: Trainer, every_n_tasks: int) -> int | None:
    """The evaluated task of the current epoch if a monitor measuring every ``every_n_tasks``-th evaluated task (task 0
    included) is due on it, else ``None`` (never in a warm-up epoch, which has nothing to probe)."""
    source: EpisodeSource = trainer.datamodule
    task = source.evaluated_task(trainer.current_epoch)
    return None if task is None or task % every_n_tasks else task


def probe_episode(trainer: Trainer, pl_module: ObservedLearner, task: int, num_queries: int | None) -> list[Tensor]:
    """``[context_x, context_y, query_x, query_y]`` of ``task``'s evaluation episode with its first ``num_queries``
    queries, on the learner's device."""
    source: EpisodeSource = trainer.datamodule
    return [t.to(pl_module.device) for t in source.episode(task, num_queries)]


def require_contract(trainer: Trainer, pl_module: ObservedLearner, who: str) -> None:
    """Raise a clear ``TypeError`` when the learner or the data module lacks what a monitor calls."""
    require(pl_module, ObservedLearner, who)
    require(trainer.datamodule, EpisodeSource, who)
