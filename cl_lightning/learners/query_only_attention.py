"""Query-only attention (Bekal, Pujari, Kelly, "Continual Learning with Query-Only Attention", arXiv 2510.00365).

Keep a replay buffer B, draw a support set S ⊂ B, score each support with a learned Q_θ and predict

    classification:  logit_c(x_t) = Σ_{j ∈ S} Q_θ(x_t, x_j, y_j) · 1[y_j = c]     (raw scores, no softmax over S)
    regression:      ŷ(x_t)       = Σ_{j ∈ S} softmax_j(Q_θ(x_t, x_j)) · y_j

then take one Adam step on the loss of the query (cross-entropy over classes, or MSE). No keys, no values.
Defaults follow the authors' Permuted-MNIST code, from which the published figures came (docs/qoa.md §4): a
FIFO buffer of 50,000, training once it is full, a contiguous window of ``support_size`` (V1: 1,000; V2: 200)
whose first example of one random class is the query and the rest minus each class's first example the
supports, one query per 400-example chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from cl_lightning.contract import StreamBatch, StreamSteps
from cl_lightning.learners.engines import FastSteps, StepKernel, StepRun, step_engine
from cl_lightning.learners.replay import ReplayLearner
from cl_lightning.memory.support_sampler import SamplerName, draw_support, query_is_incoming
from cl_lightning.nn import fused_steps
from cl_lightning.nn.cnn import make_encoder
from cl_lightning.nn.compiled import LazyCompile
from cl_lightning.nn.distributed import answer_across_ranks
from cl_lightning.nn.network_steps import WindowAttentionSteps
from cl_lightning.nn.optim import prefer_fused
from cl_lightning.nn.scorers import PairScorer

Forward = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]  # (qx, qy, sx, sy) -> (loss, predictions)
Update = Callable[[Tensor], object]  # (loss) -> None: the optimiser step


class QueryOnlyAttention(ReplayLearner):
    """Query-only attention over a replay buffer.

    Args:
        memory_size: Replay buffer capacity (authors' PMNIST code: 50,000; the paper's table: = support size).
        support_size: Window / support-set size (V1: 1,000; V2: 200). Evaluation uses this many context examples.
        sampler: ``"window"`` (authors' contiguous window), ``"uniform"`` (distinct uniform draws) or
            ``"sliding"`` (the paper's regression sampler: the newest stored example against the ``support_size``
            stored just before it).
        queries_per_step: Queries per training step (paper: 1).
        start_when_full: Train only once the buffer is full (authors' code); else once it holds one support set.
        hidden: Scorer width (paper: 100).
        num_hidden_layers: Scorer hidden → hidden layers (paper: 9).
        use_labels: Feed ``onehot(y_j)`` to the scorer (paper: on Permuted MNIST only).
        encoder: ``"flatten"`` or ``"cnn"`` (the paper's shared CNN: the scorer then sees CNN features of both).
        online_queries: Incoming examples per chunk predicted from the newest ``support_size`` stored examples
            before learning, for the online metric (ours; one suffices: docs/protocol.md §2).
        eval_across_ranks: Under DDP, split each evaluation episode's queries across the ranks and gather the
            answers; needs ``trainer.use_distributed_sampler: false``.
        compile: Run the training step's forward and loss (and so its backward) through ``torch.compile``;
            evaluation stays eager. Off by default: a short CPU run pays more to compile than it saves.
        compile_mode: ``torch.compile``'s mode (``"reduce-overhead"`` adds CUDA graphs on CUDA).
        step_kernel: The step engine, as :class:`~cl_lightning.learners.Backprop`'s (hand-written scorer gradients,
            autograd's numbers bit for bit): ``"fused"`` on classification with ``queries_per_step × support_size``
            up to ``PairScorer.pair_budget`` (the CPU Figure 1 suite sets it), ``"fused"`` and ``"native"`` on
            label-free regression, one point a chunk, the sliding sampler.
        **kwargs: :class:`~cl_lightning.learners.replay.ReplayLearner`'s: ``buffer_mode`` (paper: ``"fifo"``), the
            linked shapes, ``optimizer`` (paper: Adam, lr 1e-4) and ``seed`` (of support sampling).
    """

    def __init__(
        self,
        *,
        memory_size: int = 50_000,
        support_size: int = 1_000,
        sampler: SamplerName = "window",
        queries_per_step: int = 1,
        start_when_full: bool = True,
        hidden: int = 100,
        num_hidden_layers: int = 9,
        use_labels: bool = True,
        encoder: Literal["flatten", "cnn"] = "flatten",
        online_queries: int = 1,
        eval_across_ranks: bool = False,
        compile: bool = False,
        compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default",
        step_kernel: StepKernel = "autograd",
        **kwargs: Any,
    ) -> None:
        super().__init__(memory_size=memory_size, support_size=support_size, online_queries=online_queries, **kwargs)
        if queries_per_step < 1:
            raise ValueError("queries_per_step must be >= 1")
        if support_size + queries_per_step > memory_size:
            raise ValueError(f"support_size {support_size} + queries_per_step must fit in memory_size {memory_size}")
        self.sampler, self.queries_per_step, self.start_when_full = sampler, queries_per_step, start_when_full
        self.use_labels = use_labels and self.task_type == "classification"
        self.eval_across_ranks = eval_across_ranks
        self.compile, self.compile_mode = compile, compile_mode
        self._compiled_loss = LazyCompile(self._query_forward, compile_mode) if compile else None  # not module state
        self.encoder, features = make_encoder(encoder, self.input_shape)
        labels = self.num_outputs if self.use_labels else 0
        self.scorer = PairScorer(features, labels, hidden, num_hidden_layers)
        if sampler == "window" and self.task_type == "classification":
            self.buffer.keep_host_labels()  # the window sampler draws from host labels: no device read per step
        self.step_kernel = step_kernel
        self.engine = step_engine(step_kernel, self)

    def attend(self, query_x: Tensor, support_x: Tensor, support_y: Tensor) -> Tensor:
        """Class logits ``(Q, C)`` (sum of raw scores per class) or regression values ``(Q, k)`` (softmax over S)."""
        query_x, support_x = self.encoder(query_x), self.encoder(support_x)  # (Q, F), (S, F)
        scores = self.scorer(query_x, support_x, support_y if self.use_labels else None)  # (Q, S)
        if self.task_type == "classification":  # one-hot by comparison: F.one_hot reads min and max on the CPU
            classes = torch.arange(self.num_outputs, device=support_y.device)
            return scores @ (support_y[:, None] == classes).to(scores.dtype)  # (Q, C)
        return scores.softmax(-1) @ support_y.to(scores.dtype)  # (Q, k)

    predict_support = attend  # the replay learners' common name

    def output_layer(self) -> nn.Module:
        """The scorer's last layer (hidden → 1 score; the paper's fc11, whose Hessian it measures)."""
        return self.scorer.out

    @property
    def ready_size(self) -> int:
        """A full buffer (authors' code), or one support set plus the step's queries."""
        return self.buffer.capacity if self.start_when_full else self.support_size + self.queries_per_step

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> Tensor | None:
        """Predict a few incoming examples (online metric), store the chunk, take one step on sampled queries."""
        return self._learn(batch, run, self.query_forward, run.step)

    def _learn(self, batch: StreamBatch, run: StepRun, forward: Forward, update: Update) -> Tensor | None:
        """:meth:`learn_chunk` with its step as ``forward`` and ``update``: autograd's or the fused step's."""
        x, y, task_id = batch
        x = x.flatten(1)  # stored flat; the encoder restores image shapes
        gen = self.step_generator()
        shared = self._online_is_the_query(x)
        if not shared:
            self.log_online_from_memory(x, y, run)  # the newest support_size stored examples are the support set
        self.buffer.add(x, y, task_id, gen, host_y=self.host_labels(y))
        if not self.ready():
            return None
        (qx, qy), (sx, sy) = draw_support(self.buffer, self.sampler, self.support_size, self.queries_per_step, gen)
        loss, pred = forward(qx, qy, sx, sy)
        if shared:  # the same supports, weights and query: the online prediction is this one
            run.log_online(pred.detach(), y)
        update(loss)
        run.log_task_mean("train/loss", loss, qx.shape[0])
        return loss.detach()

    def fused_refusal(self, chunk_size: int | None = None) -> str | None:
        """The fused steps: flat inputs, eager; on regression label-free, each step's query the incoming point."""
        if self.compile or not isinstance(self.encoder, nn.Flatten):
            return "needs compile: false and encoder: flatten"
        if self.task_type == "classification":  # the scorer's gradient path then takes the pairs at once
            pairs, most = self.queries_per_step * self.support_size, PairScorer.pair_budget
            return None if pairs <= most else f"takes at most {most} pairs a step (queries × supports: {pairs})"
        if self.use_labels:
            return "needs use_labels: false on regression"
        if self.online_queries < 1 or not query_is_incoming(
            self.sampler, self.buffer, self.queries_per_step, chunk_size or 1
        ):
            return (
                "needs each step's query to be the incoming point (sampler: sliding, buffer_mode: fifo, "
                "queries_per_step: 1, online_queries >= 1, one point a chunk)"
            )
        return None

    def fused_ready(self, batch: StreamSteps, start: int) -> bool:
        """Classification: once the buffer is ready (every chunk from ``start`` then takes a step). Regression: once
        chunk ``start`` is its step's query over the ``support_size`` points before it."""
        if self.task_type == "classification":
            return self.ready()
        return self._online_is_the_query(batch.x[start].flatten(1))

    def learn_fused(self, batch: StreamSteps, start: int, run: StepRun, steps: FastSteps) -> Tensor:
        """Chunks ``start..``: classification as :meth:`learn_chunk`, stepped by ``AttentionCEStep``; regression point
        ``t`` the query of step ``t`` over the ``S`` points before it
        (:class:`~cl_lightning.nn.network_steps.WindowAttentionSteps`)."""
        if self.task_type == "classification":
            step = fused_steps.AttentionCEStep(self.scorer, self.num_outputs, steps.adam)
            chunks = (StreamBatch(batch.x[i], batch.y[i], batch.task_id[i]) for i in range(start, batch.x.shape[0]))
            losses = [self._learn(chunk, run, step.gradients, step.update) for chunk in chunks]  # each takes a step
            run.counted += len(losses)  # the buffer was ready (fused_ready): optimiser steps outside Lightning's
            return torch.stack(losses).sum()
        x, y, task_id = batch.x[start:].flatten(2)[:, 0], batch.y[start:, 0], batch.task_id[start:, 0]  # (T, D) ...
        sx, sy = self.memory_support()
        window_x, window_y = torch.cat([sx, x.to(sx.dtype)]), torch.cat([sy, y.to(sy.dtype)])
        layers = [*self.scorer.hidden, self.scorer.out]
        preds = steps(WindowAttentionSteps(self.scorer.first, layers, window_x, window_y, sx.shape[0]))
        self.count_steps(x.shape[0])  # what step_generator would have counted
        self.buffer.add(x, y, task_id)  # a FIFO: storing T points at once stores them one after another
        return run.add_fused(preds, y[:, None], 1)

    def _online_is_the_query(self, x: Tensor) -> bool:
        """Whether the online prediction of ``x`` is this step's training prediction: the buffer answers before and
        is ready after storing the point, which is then the query over the online metric's support set."""
        return (
            query_is_incoming(self.sampler, self.buffer, self.queries_per_step, x.shape[0])
            and self.online_queries >= 1
            and self.online_ready()
            and min(len(self.buffer) + 1, self.buffer.capacity) >= self.ready_size
        )

    def query_loss(self, qx: Tensor, qy: Tensor, sx: Tensor, sy: Tensor) -> Tensor:
        """The training loss of queries ``(qx, qy)`` attending over supports ``(sx, sy)``; compiled with ``compile``."""
        return self.query_forward(qx, qy, sx, sy)[0]

    def query_forward(self, qx: Tensor, qy: Tensor, sx: Tensor, sy: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`query_loss` and the queries' predictions (:class:`~cl_lightning.nn.compiled.LazyCompile`)."""
        forward = self._query_forward if self._compiled_loss is None else self._compiled_loss
        return forward(qx, qy, sx, sy)

    def _query_forward(self, qx: Tensor, qy: Tensor, sx: Tensor, sy: Tensor) -> tuple[Tensor, Tensor]:
        pred = self.attend(qx, sx, sy)
        return self.loss(pred, qy), pred

    def configure_optimizers(self) -> torch.optim.Optimizer | None:
        """The optimiser factory's optimiser, Adam switched to its fused kernel (the same update)."""
        return prefer_fused(super().configure_optimizers())

    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """Attend from each query over the episode's support set (:meth:`episode_support`); with
        ``eval_across_ranks`` the queries are split across the DDP ranks and the answers gathered."""
        sx, sy = self.episode_support(context_x, context_y)
        if self.eval_across_ranks:
            return answer_across_ranks(lambda q: self.attend(q, sx, sy), query_x.flatten(1), sx)
        return self.attend(query_x.flatten(1), sx, sy)
