"""Weighted k-nearest neighbours / Nadaraya–Watson over a support set: the non-parametric reference that Bekal et
al. 2025 (arXiv 2510.00365) frame query-only attention against ("kNN with a learned metric"; not run in the paper).

    ŷ(x) = Σ_{j ∈ N_k(x)} w(x, x_j) y_j / Σ_{j ∈ N_k(x)} w(x, x_j),    d_j = ‖x − x_j‖₂,
    w = 1 / (d_j + ε)   ("inverse")   or   w = exp(−d_j² / (2 h²))   ("gaussian", bandwidth h)

over the ``k`` nearest supports (all of them with ``k = None``: the Nadaraya–Watson estimator). For classification
``y_j`` is ``onehot(y_j)`` and the prediction is the log of the weighted class vote. Nothing is trained: the stream
only fills a FIFO (or reservoir) buffer, which is the support set when an episode brings no context.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from cl_lightning.contract import StreamBatch
from cl_lightning.learners.engines import StepRun
from cl_lightning.learners.replay import ReplayLearner


def knn_predict(
    query_x: Tensor,
    support_x: Tensor,
    support_y: Tensor,
    k: int | None,
    weighting: Literal["inverse", "gaussian"],
    bandwidth: float = 1.0,
    eps: float = 1e-8,
) -> Tensor:
    """Weighted kNN: ``query_x (Q, D), support_x (S, D), support_y (S, C) float -> (Q, C)`` weighted means."""
    dist = torch.cdist(query_x, support_x)  # (Q, S)
    if k is not None and k < dist.shape[1]:
        dist, idx = dist.topk(k, dim=1, largest=False)  # (Q, k)
        values = support_y[idx]  # (Q, k, C)
    else:
        values = support_y.expand(dist.shape[0], *support_y.shape)  # (Q, S, C)
    # log-weights, normalised by a softmax: Gaussian weights of far points underflow without it
    log_w = -(dist + eps).log() if weighting == "inverse" else -(dist**2) / (2 * bandwidth**2)
    return (log_w.softmax(-1)[..., None] * values).sum(1)  # (Q, C)


def _no_optimizer(params: Any) -> None:
    """kNN's optimiser factory, never called (with no parameters ``configure_optimizers`` returns nothing)."""
    raise AssertionError("KNN has nothing to optimise")


class KNN(ReplayLearner):
    """Distance-weighted kNN with no parameters; the episode's context (or the buffer) is the support set.

    Args:
        k: Neighbours per query; ``None`` weighs every support (Nadaraya–Watson).
        weighting: ``"inverse"`` (w = 1/d, the paper's first form) or ``"gaussian"`` (w = exp(−d²/2h²)).
        bandwidth: Gaussian bandwidth ``h`` in input units.
        online_queries: Incoming examples per chunk predicted before they are stored, for the online metric.
        **kwargs: :class:`~cl_lightning.learners.replay.ReplayLearner`'s but ``optimizer`` (nothing is trained):
            ``memory_size`` is the support set of the online metric and of context-free predictions, ``seed`` the
            seed of reservoir admission draws.
    """

    fixed_arguments = ("optimizer",)

    def __init__(
        self,
        *,
        k: int | None = 10,
        weighting: Literal["inverse", "gaussian"] = "inverse",
        bandwidth: float = 1.0,
        online_queries: int = 400,
        **kwargs: Any,
    ) -> None:
        super().__init__(online_queries=online_queries, optimizer=_no_optimizer, **kwargs)
        if (k is not None and k < 1) or bandwidth <= 0:
            raise ValueError("k must be >= 1 (or null) and bandwidth > 0")
        self.k, self.weighting, self.bandwidth = k, weighting, bandwidth

    def setup(self, stage: str) -> None:
        """Refuse DDP: ``DistributedDataParallel`` wraps only modules with trainable parameters, and kNN has none."""
        if self.trainer.world_size > 1:
            raise ValueError("KNN has no parameters to train across devices: run it with trainer.devices=1")

    def online_ready(self) -> bool:
        """kNN answers from any non-empty buffer."""
        return len(self.buffer) > 0

    def output_layer(self) -> None:
        """kNN has no trained read-out."""
        return

    def predict_support(self, query_x: Tensor, support_x: Tensor, support_y: Tensor) -> Tensor:
        """Log class votes ``(Q, C)`` (classification) or weighted means ``(Q, k)`` (regression)."""
        query_x, support_x = query_x.flatten(1), support_x.flatten(1)
        classification = self.task_type == "classification"
        values = nn.functional.one_hot(support_y, self.num_outputs) if classification else support_y
        pred = knn_predict(query_x, support_x, values.to(query_x.dtype), self.k, self.weighting, self.bandwidth)
        return pred.clamp_min(1e-12).log() if classification else pred

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> None:
        """Predict the incoming chunk from the buffer (online metric), then store it; no gradient step."""
        x, y, task_id = batch
        x = x.flatten(1)
        self.log_online_from_memory(x, y, run)
        self.buffer.add(x, y, task_id, self.step_generator() if self.buffer.mode == "reservoir" else None)
