"""Weighted k-nearest neighbours / Nadaraya–Watson over a support set: the non-parametric reference that Bekal et
al. 2025 (arXiv 2510.00365) frame query-only attention against ("kNN with a learned metric"; not run in the paper).

    ŷ(x) = Σ_{j ∈ N_k(x)} w(x, x_j) y_j / Σ_{j ∈ N_k(x)} w(x, x_j),    d_j = ‖x − x_j‖₂,
    w = 1 / (d_j + ε)   ("inverse")   or   w = exp(−d_j² / (2 h²))   ("gaussian", bandwidth h)

over the ``k`` nearest supports (all of them with ``k = None``: the Nadaraya–Watson estimator), on raw inputs or on
inputs standardised by the support set's per-feature mean and deviation. For classification ``y_j`` is
``onehot(y_j)`` and the prediction is the log of the weighted class vote. Nothing is trained: the stream only fills a
FIFO (or reservoir) buffer, which is the support set when an episode brings no context.

A fixed kernel is only a fair reference at its best: with a :class:`KernelGrid` the kNN picks its kernel (``k``,
weighting, standardisation) on the stream's warm-up tasks, which are never evaluated, and keeps it for the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from typing import Any, Literal, NamedTuple

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from cl_lightning.contract import EpisodeSource, StreamBatch
from cl_lightning.learners.engines import StepRun
from cl_lightning.learners.replay import ReplayLearner

Weighting = Literal["inverse", "gaussian"]


def standardise(query_x: Tensor, support_x: Tensor, min_std: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Queries and supports centred on the supports' per-feature mean and divided by their deviation; a feature
    constant over the supports (deviation ≤ ``min_std``: an always-black border pixel) is dropped, not blown up."""
    mean, std = support_x.mean(0), support_x.std(0, correction=0)
    scale = torch.where(std > min_std, std.clamp_min(min_std).reciprocal(), torch.zeros_like(std))
    return (query_x - mean) * scale, (support_x - mean) * scale


def knn_predict(
    query_x: Tensor,
    support_x: Tensor,
    support_y: Tensor,
    k: int | None,
    weighting: Weighting,
    bandwidth: float = 1.0,
    eps: float = 1e-8,
    standardised: bool = False,
) -> Tensor:
    """Weighted kNN: ``query_x (Q, D), support_x (S, D), support_y (S, C) float -> (Q, C)`` weighted means, on
    :func:`standardise`'d inputs if ``standardised``."""
    if standardised:
        query_x, support_x = standardise(query_x, support_x)
    dist = torch.cdist(query_x, support_x)  # (Q, S)
    if k is not None and k < dist.shape[1]:
        dist, idx = dist.topk(k, dim=1, largest=False)  # (Q, k)
        values = support_y[idx]  # (Q, k, C)
    else:
        values = support_y.expand(dist.shape[0], *support_y.shape)  # (Q, S, C)
    # log-weights, normalised by a softmax: Gaussian weights of far points underflow without it
    log_w = -(dist + eps).log() if weighting == "inverse" else -(dist**2) / (2 * bandwidth**2)
    return (log_w.softmax(-1)[..., None] * values).sum(1)  # (Q, C)


class Kernel(NamedTuple):
    """One fixed kNN kernel: neighbours (``None``: all supports), weighting, and whether inputs are standardised."""

    k: int | None
    weighting: Weighting
    standardised: bool = False

    def __str__(self) -> str:
        inputs = "standardised inputs" if self.standardised else "raw inputs"
        return f"k={self.k if self.k is not None else 'all'}, {self.weighting} weights, {inputs}"


@dataclass(frozen=True)
class KernelGrid:
    """The fixed kernels a :class:`KNN` picks among on the stream's warm-up tasks (never on evaluated ones).

    On each warm-up task the task's first ``support_size`` examples (in arrival order, as an evaluation context
    is) are the supports and the next ``queries_per_task`` the queries; every kernel of the grid answers them, and the
    one with the best mean score over the warm-up tasks (accuracy, or MSE for regression; ties: the earlier in the
    grid) serves the rest of the run. The default grid is the stated set of issue 45: 6 × 2 × 2 = 24 kernels.

    Args:
        k: Neighbour counts (``null``: all supports).
        weighting: Weightings (``inverse``: 1/d; ``gaussian``: the kNN's ``bandwidth``).
        standardised: Whether inputs are standardised by the supports' per-feature mean and deviation.
        queries_per_task: Queries scored per warm-up task.
    """

    k: list[int | None] = field(default_factory=lambda: [1, 3, 5, 10, 20, 50])
    weighting: list[Weighting] = field(default_factory=lambda: ["inverse", "gaussian"])
    standardised: list[bool] = field(default_factory=lambda: [False, True])
    queries_per_task: int = 2000

    def __post_init__(self) -> None:
        if not (self.k and self.weighting and self.standardised) or self.queries_per_task < 1:
            raise ValueError("a KernelGrid needs at least one k, weighting and standardisation, and queries >= 1")
        if any(k is not None and k < 1 for k in self.k):
            raise ValueError(f"every k of a KernelGrid must be >= 1 (or null), got {self.k}")

    def kernels(self) -> list[Kernel]:
        """The grid's kernels, standardisation outermost, then weighting, then ``k`` (the tie-breaking order)."""
        return [Kernel(k, w, s) for s, w, k in product(self.standardised, self.weighting, self.k)]


def _no_optimizer(params: Any) -> None:
    """kNN's optimiser factory, never called (with no parameters ``configure_optimizers`` returns nothing)."""
    raise AssertionError("KNN has nothing to optimise")


class KNN(ReplayLearner):
    """Distance-weighted kNN with no parameters; the episode's context (or the buffer) is the support set.

    Args:
        k: Neighbours per query; ``None`` weighs every support (Nadaraya–Watson).
        weighting: ``"inverse"`` (w = 1/d, the paper's first form) or ``"gaussian"`` (w = exp(−d²/2h²)).
        bandwidth: Gaussian bandwidth ``h`` in input units (standardised units with standardised inputs).
        standardised: Standardise inputs by the support set's per-feature mean and deviation (:func:`standardise`).
        select: If set, the kernel (``k``, ``weighting``, ``standardised``) is picked from this grid on the stream's
            warm-up tasks, when the first evaluated task starts; the arguments above serve the warm-up only. The
            choice and every kernel's warm-up score are kept in checkpoints and logged (``knn/k``: 0 for all
            supports, ``knn/gaussian``, ``knn/standardised``, ``knn/selection_score``).
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
        weighting: Weighting = "inverse",
        bandwidth: float = 1.0,
        standardised: bool = False,
        select: KernelGrid | None = None,
        online_queries: int = 400,
        **kwargs: Any,
    ) -> None:
        super().__init__(online_queries=online_queries, optimizer=_no_optimizer, **kwargs)
        if (k is not None and k < 1) or bandwidth <= 0:
            raise ValueError("k must be >= 1 (or null) and bandwidth > 0")
        self.kernel, self.bandwidth, self.select = Kernel(k, weighting, standardised), bandwidth, select
        if select is not None:  # the choice (-1: not yet made) and the grid's warm-up scores, kept in checkpoints
            self.register_buffer("kernel_choice", torch.tensor(-1))
            self.register_buffer("selection_scores", torch.zeros(len(select.kernels()), dtype=torch.float64))

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        """Load the buffers, then serve a checkpoint's chosen kernel."""
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.select is not None and int(self.kernel_choice) >= 0:
            self.kernel = self.select.kernels()[int(self.kernel_choice)]

    @property
    def k(self) -> int | None:
        """Neighbours per query of the kernel in use."""
        return self.kernel.k

    @property
    def weighting(self) -> Weighting:
        """Weighting of the kernel in use."""
        return self.kernel.weighting

    def setup(self, stage: str) -> None:
        """Refuse DDP: ``DistributedDataParallel`` wraps only modules with trainable parameters, and kNN has none."""
        if self.trainer.world_size > 1:
            raise ValueError("KNN has no parameters to train across devices: run it with trainer.devices=1")

    def on_train_epoch_start(self) -> None:
        """With a :class:`KernelGrid`, pick the kernel when the first evaluated task starts (once per run)."""
        super().on_train_epoch_start()
        source = self.trainer.datamodule
        if self.select is None or int(self.kernel_choice) >= 0 or source.evaluated_task(self.current_epoch) is None:
            return
        if source.warmup_tasks < 1:
            raise ValueError(
                "KNN's select picks its kernel on the stream's warm-up tasks, and this stream has none: set "
                "data.stream.init_args.warmup_tasks (the paper's Permuted-MNIST runs use 5), or drop select"
            )
        self.choose_kernel(source)

    def choose_kernel(self, source: EpisodeSource) -> Kernel:
        """Score every kernel of the grid on every warm-up task of ``source`` (supports: the task's first
        ``support_size`` examples; queries: the next ``queries_per_task``), serve the best, log and return it."""
        assert self.select is not None
        kernels = self.select.kernels()
        total = torch.zeros(len(kernels), dtype=torch.float64)
        for task in range(source.warmup_tasks):
            batches = list(source.task_batches(task, self.support_size + self.select.queries_per_task))
            x = torch.cat([b.x for b in batches]).flatten(1).to(self.device)
            y = torch.cat([b.y for b in batches]).to(self.device)
            if x.shape[0] <= self.support_size:
                raise ValueError(f"warm-up task {task} has no example after its {self.support_size} supports")
            support_x, support_y = x[: self.support_size], y[: self.support_size]
            query_x, query_y = x[self.support_size :], y[self.support_size :]
            with torch.no_grad():
                for i, kernel in enumerate(kernels):
                    pred = self.predict_with(kernel, query_x, support_x, support_y)
                    total[i] += float(self.score(pred.double(), query_y))
        scores = total / source.warmup_tasks
        best = int(scores.argmax() if self.task_type == "classification" else scores.argmin())
        self.selection_scores.copy_(scores)
        self.kernel_choice.fill_(best)
        self.kernel = kernels[best]
        self.log_dict(
            {
                "knn/k": float(self.k or 0),
                "knn/gaussian": float(self.weighting == "gaussian"),
                "knn/standardised": float(self.kernel.standardised),
                "knn/selection_score": float(scores[best]),
            },
            on_step=False,
            on_epoch=True,
        )
        rank_zero_info(
            f"KNN: {self.kernel} chosen on {source.warmup_tasks} warm-up tasks ({self.metric_name} "
            f"{float(scores[best]):.4f}; {len(kernels)} kernels scored {float(scores.min()):.4f}-"
            f"{float(scores.max()):.4f})"
        )
        return self.kernel

    def online_ready(self) -> bool:
        """kNN answers from any non-empty buffer."""
        return len(self.buffer) > 0

    def output_layer(self) -> None:
        """kNN has no trained read-out."""
        return

    def predict_support(self, query_x: Tensor, support_x: Tensor, support_y: Tensor) -> Tensor:
        """Log class votes ``(Q, C)`` (classification) or weighted means ``(Q, k)`` (regression)."""
        return self.predict_with(self.kernel, query_x, support_x, support_y)

    def predict_with(self, kernel: Kernel, query_x: Tensor, support_x: Tensor, support_y: Tensor) -> Tensor:
        """:meth:`predict_support` with ``kernel`` in place of the kernel in use."""
        query_x, support_x = query_x.flatten(1), support_x.flatten(1)
        classification = self.task_type == "classification"
        values = nn.functional.one_hot(support_y, self.num_outputs) if classification else support_y
        k, weighting, standardised = kernel
        pred = knn_predict(
            query_x, support_x, values.to(query_x.dtype), k, weighting, self.bandwidth, 1e-8, standardised
        )
        return pred.clamp_min(1e-12).log() if classification else pred

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> None:
        """Predict the incoming chunk from the buffer (online metric), then store it; no gradient step."""
        x, y, task_id = batch
        x = x.flatten(1)
        self.log_online_from_memory(x, y, run)
        self.buffer.add(x, y, task_id, self.step_generator() if self.buffer.mode == "reservoir" else None)
