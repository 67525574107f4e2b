"""The per-task mean every learner logs its online metric and loss with (``ContinualLearner.log_task_mean``): made
on a name's first value, updated once per name with a step engine's held-back terms, reduced over DDP ranks at the
task's end."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric

__all__ = ["TaskMean", "Terms", "add_terms", "reduce_task_means", "task_mean"]

Terms = dict[str, tuple[list[Tensor], list[int]]]
"""Task-mean terms held back by name: batch means (0-d per chunk, or 1-d for a fused run of steps) and the number of
examples each stands for."""


class TaskMean(Metric):
    """Weighted mean of batch means over one task: float64 sums of ``value · weight`` and ``weight``, summed over DDP
    ranks by torchmetrics.

    Not ``torchmetrics.MeanMetric`` (1.9; timings: docs/results/overhead.md): with ``nan_strategy="disable"`` it drops
    the weights; the other strategies synchronise with the host per update, and all but ``"error"`` drop a NaN. Here a
    NaN stays NaN, so a diverged run shows as one.
    """

    full_state_update = False
    total: Tensor
    weight: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: Tensor, weight: float) -> None:
        """Add a batch mean ``value`` of ``weight`` examples."""
        self.total.add_(value.detach().to(torch.float64), alpha=weight)  # one kernel; value · weight is exact in f64
        self.weight.add_(weight)

    def update_many(self, values: Tensor, weights: Tensor) -> None:
        """Add batch means ``values (N,)`` of ``weights (N,)`` examples each (float64 products, as :meth:`update`)."""
        weights = weights.to(self.total)
        self.total.add_((values.detach().to(torch.float64) * weights).sum())
        self.weight.add_(weights.sum())

    def compute(self) -> Tensor:
        """The weighted mean (NaN when nothing was added on any rank)."""
        return self.total / self.weight


def task_mean(means: dict[str, TaskMean], name: str, device: torch.device) -> TaskMean:
    """``means[name]``, made on ``device`` when the task's first value of ``name`` arrives."""
    if name not in means:
        means[name] = TaskMean().to(device)
    return means[name]


def add_terms(means: dict[str, TaskMean], terms: Terms, device: torch.device) -> None:
    """Add held-back ``terms`` to the task means, one :meth:`TaskMean.update_many` per name."""
    for name, (values, weights) in terms.items():  # values: 0-d per chunk, or 1-d for a fused run of chunks
        values_t = torch.cat([v.reshape(-1) for v in values])
        task_mean(means, name, device).update_many(values_t, torch.tensor(weights, dtype=torch.float64))


def reduce_task_means(means: dict[str, TaskMean], device: torch.device) -> dict[str, Tensor]:
    """The task means to log at the task's end, by name (float32), summed over DDP ranks; names no rank added to
    are left out. The names are gathered first (a rank may have had nothing to predict yet), so every rank reduces
    the same metrics in the same order."""
    names = sorted(means)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[list[str] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, names)
        names = sorted(set().union(*(g or [] for g in gathered)))
    reduced = {}
    for name in names:
        metric = means.get(name) or TaskMean().to(device)
        with metric.sync_context():  # torchmetrics all-gathers the states and sums them (no-op on one process)
            total, weight = metric.total.clone(), metric.weight.clone()
        if weight > 0:
            reduced[name] = (total / weight).float()
    return reduced
