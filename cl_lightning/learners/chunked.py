"""Chunked stepping: the bookkeeping of a ``StreamSteps`` batch (``data.steps_per_batch`` chunks) that
``ContinualLearner.learn_steps`` learns in one training step (docs/architecture.md, "Chunked stepping").

Each chunk is predicted, logged and learned before the next one is seen, as with one chunk per batch, so the numbers
are the same bit for bit (``tests/test_scr_steps.py``); the bookkeeping differs. The optimiser is stepped by hand
(:meth:`ChunkedRun.step`: manual optimisation, outside Lightning's precision plugin, so in full precision only:
:func:`check_steps`); the chunks' task-mean terms and online predictions are held in the :class:`ChunkedRun` and
added once per batch; before each chunk the rest of the batch is offered to the learner's fused step
(``learn_fused``, :mod:`cl_lightning.learners.fused`) until it refuses. Lightning's step counters are advanced by
the base (``ContinualLearner._count_steps``), the one learner module that reaches the fit loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from lightning.pytorch import Trainer
from torch import Tensor, nn

from cl_lightning.contract import StreamBatch, StreamSteps
from cl_lightning.learners.task_mean import Terms

__all__ = ["FULL_PRECISION", "ChunkedRun", "SteppingLearner", "check_steps", "learn_steps"]

FULL_PRECISION = ("32-true", "64-true", "32", "64")  # trainer.precision values learn_steps may run under


@dataclass
class ChunkedRun:
    """The bookkeeping of the running ``StreamSteps`` batch (``ContinualLearner._chunked`` while ``learn_steps``
    runs).

    Attributes:
        optimizer: The trainer's optimiser, stepped by hand (:meth:`step`); ``None`` when nothing is trained (kNN).
        fused_refused: ``learn_fused`` cannot run in this batch (:mod:`cl_lightning.learners.fused`): stop asking.
        terms: The task-mean terms of ``log_task_mean``, added once per batch (``ContinualLearner._add_deferred``).
        online: The online predictions of ``log_online`` and their targets, scored once per batch.
        steps: Optimiser steps taken in the batch.
    """

    optimizer: torch.optim.Optimizer | None
    fused_refused: bool
    terms: Terms = field(default_factory=dict)
    online: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    steps: int = 0

    def step(self, loss: Tensor) -> None:
        """One optimiser step on ``loss``: the optimiser itself, without Lightning's wrapper (one process, full
        precision: the data module refuses ``StreamSteps`` under DDP)."""
        optimizer = self.optimizer
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        self.steps += 1

    def add(self, name: str, value: Tensor, weight: int) -> None:
        """Hold back a batch mean ``value`` of ``weight`` examples for the task mean of ``name``."""
        values, weights = self.terms.setdefault(name, ([], []))
        values.append(value.detach())
        weights.append(weight)


class SteppingLearner(Protocol):
    """What chunked stepping uses of a learner (``ContinualLearner`` has it all; this module cannot import the base,
    which imports it)."""

    trainer: Trainer
    fused_steps: bool
    _chunked: ChunkedRun | None

    def learns_steps(self) -> bool: ...
    def learn_chunk(self, batch: StreamBatch) -> Tensor | None: ...
    def learn_fused(self, batch: StreamSteps, start: int) -> Tensor | None: ...
    def parameters(self) -> Iterator[nn.Parameter]: ...
    def _add_deferred(self, deferred: Terms, online: list[tuple[Tensor, Tensor]], device: torch.device) -> None: ...
    def _count_steps(self, steps: int) -> None: ...


def check_steps(learner: SteppingLearner) -> None:
    """Refuse a ``StreamSteps`` batch the learner cannot learn: it has no chunk step of its own
    (``ContinualLearner.learns_steps``), or the trainer's precision is not full (the steps run outside the precision
    plugin)."""
    if not learner.learns_steps():
        raise TypeError(f"{type(learner).__name__} learns one chunk per training batch: set data.steps_per_batch: 1")
    if str(learner.trainer.precision) not in FULL_PRECISION:
        raise ValueError(
            f"data.steps_per_batch > 1 steps the optimiser outside Lightning's precision plugin: "
            f"trainer.precision {learner.trainer.precision!r} needs data.steps_per_batch: 1 (or 32-true / 64-true)"
        )


def learn_steps(learner: SteppingLearner, batch: StreamSteps) -> Tensor | None:
    """``learner.learn_chunk`` on each chunk of the batch in arrival order, until ``learner.learn_fused`` (asked before
    each chunk until it refuses) learns the rest, under a :class:`ChunkedRun`; then the run's terms are added to the
    task means and its optimiser steps to ``global_step``. The summed losses (``ContinualLearner.learn_steps``)."""
    optimizer = learner.trainer.optimizers[0] if learner.trainer.optimizers else None
    # learn_fused's refusal is decided once per batch (a refusal's causes do not change in one)
    run = learner._chunked = ChunkedRun(optimizer, fused_refused=not learner.fused_steps)
    losses = []
    try:  # a loop over time: each chunk is learned before the next one is predicted
        for i in range(batch.x.shape[0]):
            fused = None if run.fused_refused else learner.learn_fused(batch, i)
            if fused is not None:  # chunks i.. were learned by the fused step
                losses.append(fused)
                break
            loss = learner.learn_chunk(StreamBatch(batch.x[i], batch.y[i], batch.task_id[i]))
            if loss is not None:
                losses.append(loss.detach())
    finally:
        learner._chunked = None
    learner._add_deferred(run.terms, run.online, batch.x.device)
    # global_step: the optimiser steps taken; with nothing to train (kNN) every chunk, as Lightning's loop counts
    learner._count_steps(run.steps if any(p.requires_grad for p in learner.parameters()) else batch.x.shape[0])
    return torch.stack(losses).sum() if losses else None
