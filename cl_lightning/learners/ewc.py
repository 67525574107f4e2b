"""Elastic weight consolidation (Kirkpatrick et al. 2017) as the QOA paper ran it (docs/baselines.md §3, with its
settings and how other "EWC"s differ).

At the end of each task, a diagonal empirical Fisher from the task's training chunks with the true labels,
``F_i = Σ_batches (∂L_batch/∂θ_i)² · |batch| / N``, and an anchor copy θ* of the weights; the last K tasks' pairs
are kept in preallocated buffers (a ring of K slots; empty slots have F = 0), and training minimises

    L = CE + (λ/2) Σ_k Σ_i F_k,i (θ_i − θ*_k,i)²

Task-aware: it reads the finished task's data through :class:`cl_lightning.contract.EpisodeSource`. DDP: every rank
computes the same Fisher from the whole task, so penalties agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from cl_lightning.contract import EpisodeSource, StreamBatch, require
from cl_lightning.learners.backprop import Backprop


class EWC(Backprop):
    """Backprop with quadratic penalties anchoring the weights of the last ``num_penalties`` tasks.

    Args:
        ewc_lambda: λ of the penalty (paper: 1e5).
        num_penalties: K, the number of past tasks whose penalties are kept (paper: 5).
        fisher_samples: Training examples of the task the Fisher is computed from, the first ones in arrival
            order (``None``: all of them, as the paper).
        **kwargs: :class:`~cl_lightning.learners.backprop.Backprop`'s (paper, Split Tiny ImageNet: ``hidden_sizes``
            [128, 128] after the CNN encoder, Kaiming-uniform init, Adam lr 1e-4; ``seed`` is unused by EWC).
    """

    def __init__(
        self, *, ewc_lambda: float = 1e5, num_penalties: int = 5, fisher_samples: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if ewc_lambda < 0 or num_penalties < 1 or (fisher_samples is not None and fisher_samples < 1):
            raise ValueError(
                "ewc_lambda >= 0, num_penalties >= 1 and fisher_samples >= 1 (or null) are required, got "
                f"ewc_lambda={ewc_lambda}, num_penalties={num_penalties}, fisher_samples={fisher_samples}"
            )
        self.ewc_lambda, self.num_penalties, self.fisher_samples = ewc_lambda, num_penalties, fisher_samples
        num_params = sum(p.numel() for p in self._weights())
        self.register_buffer("fisher", torch.zeros(num_penalties, num_params))  # (K, P)
        self.register_buffer("anchors", torch.zeros(num_penalties, num_params))  # (K, P)
        self.register_buffer("tasks_consolidated", torch.zeros((), dtype=torch.long))

    def _weights(self) -> list[Tensor]:
        return [p for p in self.parameters() if p.requires_grad]

    def penalty(self) -> Tensor:
        """``(λ/2) Σ_k Σ_i F_k,i (θ_i − θ*_k,i)²`` at the current weights (0 before the first task ends)."""
        theta = torch.cat([p.flatten() for p in self._weights()])  # (P,)
        return 0.5 * self.ewc_lambda * (self.fisher * (theta - self.anchors).square()).sum()

    def training_step(self, batch: StreamBatch, batch_idx: int) -> Tensor:
        """Cross-entropy of the chunk (logged as the online metric) plus the EWC penalty."""
        x, y, _ = batch
        pred = self.predict(x)
        loss = self.loss(pred, y)
        self.log_online(pred, y, loss)
        penalty = self.penalty()
        self.log_task_mean("train/ewc_penalty", penalty, x.shape[0])
        return loss + penalty

    def consolidate(self, batches: Iterable[tuple[Tensor, Tensor]]) -> None:
        """Store the empirical Fisher of ``batches`` (the finished task's data, true labels) and the current
        weights in the oldest of the K slots."""
        weights = self._weights()
        fisher, seen = torch.zeros_like(self.fisher[0]), 0
        with torch.enable_grad():
            for x, y in batches:
                grads = torch.autograd.grad(self.loss(self.predict(x), y), weights)
                fisher += torch.cat([g.flatten() for g in grads]).square() * x.shape[0]
                seen += x.shape[0]
        slot = (self.tasks_consolidated % self.num_penalties).view(1)  # on the device: no host read
        self.fisher.index_copy_(0, slot, (fisher / max(seen, 1))[None])
        self.anchors.index_copy_(0, slot, torch.cat([p.detach().flatten() for p in weights])[None])
        self.tasks_consolidated += 1

    def on_train_epoch_end(self) -> None:
        """At the task's end (one epoch = one task): Fisher and anchor of the finished task, from its training chunks
        in arrival order, cut at ``fisher_samples`` examples."""
        super().on_train_epoch_end()
        source = getattr(self.trainer, "datamodule", None)
        require(source, EpisodeSource, "EWC (task-aware: it reads each finished task's data)")
        chunks = source.task_batches(self.trainer.current_epoch, self.fisher_samples)
        self.consolidate((x.to(self.device), y.to(self.device)) for x, y, _ in chunks)
