"""Full attention: the in-context transformer baseline of Bekal et al. 2025 ("Transformer" in its figures;
arXiv 2510.00365; docs/baselines.md §5), adapted from Wang, Chandra & Zhang (arXiv 2503.20018).

Supports are tokens ``[x_j, onehot(y_j)]`` (regression: ``[x_j, y_j]``), the query is ``[x_t, 0]``; a stack of
single-head self-attention layers with residuals only (:class:`~cl_lightning.nn.transformer.TinyTransformer`)
runs over them and the prediction is the query token's label slot of the last layer:

    ŷ(x_t) = Transformer([x_1, e_{y_1}], …, [x_S, e_{y_S}], [x_t, 0])[query, label slot]

then one Adam step per chunk on CE (or MSE). Defaults follow the authors' Permuted-MNIST code (each stream's
settings: docs/baselines.md §5). Evaluation uses the first ``support_size`` examples of the episode's context (the
paper: the first 100 of the task, 99 used).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from cl_lightning.contract import StreamBatch
from cl_lightning.learners.engines import StepRun
from cl_lightning.learners.replay import ReplayLearner
from cl_lightning.nn.cnn import make_encoder
from cl_lightning.nn.transformer import TinyTransformer


def adam_5e4(params: object) -> torch.optim.Optimizer:
    """Adam with lr 5e-4: the full-attention baseline's optimiser on Permuted MNIST ("to match" Wang et al.)."""
    return torch.optim.Adam(params, lr=5e-4)


class FullAttention(ReplayLearner):
    """An in-context transformer over ``[x, label]`` tokens from a replay buffer.

    Args:
        memory_size: FIFO buffer capacity (authors' code: 100 on PMNIST, 200 on Split Tiny ImageNet).
        support_size: Support tokens per query (PMNIST: 99; Split: 199 in the code, 180 in the paper).
        queries_per_step: Newest stored examples used as queries per step (authors' code: 1, the newest).
        admit_last: Only each chunk's last ``admit_last`` examples enter the buffer (PMNIST code: 100); ``None``: all.
        num_layers: Attention layers (PMNIST: 10; Split: 3; SCR: 2 in the code, 1 in the paper).
        embed_dim: Width of a linear projection (no activation) of the encoded input before tokenising (the Split
            code's ``fc1``: 128); ``None``: no projection.
        isolate_queries: ``"sequence"`` (authors' model: each query its own sequence ``[supports, query]``) or
            ``"mask"`` (one sequence; supports see supports only, each query the supports and itself: cheaper, a
            different model).
        encoder: ``"flatten"`` or ``"cnn"`` (the paper's shared CNN).
        optimizer: Optimiser factory (PMNIST: Adam, lr 5e-4; Split and SCR: 1e-4).
        **kwargs: :class:`~cl_lightning.learners.replay.ReplayLearner`'s but ``buffer_mode`` (always FIFO):
            ``online_queries``, the linked shapes and ``seed`` (unused: its sampling is deterministic).
    """

    fixed_arguments = ("buffer_mode",)

    def __init__(
        self,
        *,
        memory_size: int = 100,
        support_size: int = 99,
        queries_per_step: int = 1,
        admit_last: int | None = 100,
        num_layers: int = 10,
        embed_dim: int | None = None,
        isolate_queries: Literal["sequence", "mask"] = "sequence",
        encoder: Literal["flatten", "cnn"] = "flatten",
        optimizer: OptimizerCallable = adam_5e4,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            memory_size=memory_size, buffer_mode="fifo", support_size=support_size, optimizer=optimizer, **kwargs
        )
        if queries_per_step < 1 or (admit_last is not None and admit_last < 1):
            raise ValueError("queries_per_step and admit_last must be >= 1")
        if support_size + queries_per_step > memory_size:
            raise ValueError(f"support_size {support_size} + queries_per_step must fit in memory_size {memory_size}")
        self.queries_per_step, self.admit_last, self.isolate_queries = queries_per_step, admit_last, isolate_queries
        self.encoder, features = make_encoder(encoder, self.input_shape)
        self.embed = nn.Identity() if embed_dim is None else nn.Linear(features, embed_dim)
        width = (features if embed_dim is None else embed_dim) + self.num_outputs
        self.transformer = TinyTransformer(width, num_layers)

    def tokens(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """``[features(x), label slot]`` tokens ``(N, F + C)``; the slot is ``onehot(y)``, ``y`` or zeros (query)."""
        feats = self.embed(self.encoder(x))  # (N, F)
        if y is None:
            slot = feats.new_zeros(feats.shape[0], self.num_outputs)
        elif self.task_type == "classification":
            slot = nn.functional.one_hot(y, self.num_outputs).to(feats.dtype)
        else:
            slot = y.to(feats.dtype)
        return torch.cat([feats, slot], -1)

    def attend(self, query_x: Tensor, support_x: Tensor, support_y: Tensor, fast: bool = True) -> Tensor:
        """Logits or values ``(Q, C)``: the query tokens' label slots after the last layer."""
        s, q = self.tokens(support_x, support_y), self.tokens(query_x)  # (S, D), (Q, D)
        n_s = s.shape[0]
        if self.isolate_queries == "mask":
            z = self.transformer(torch.cat([s, q])[None], num_supports=n_s, fast=fast)[0, n_s:]  # (Q, D)
        else:
            seqs = torch.cat([s.expand(q.shape[0], *s.shape), q[:, None]], 1)  # (Q, S + 1, D)
            z = self.transformer(seqs, fast=fast)[:, -1]  # (Q, D)
        return z[:, -self.num_outputs :]

    predict_support = attend  # the replay learners' common name

    def output_layer(self) -> nn.Module:
        """The last layer's value projection: what its attention adds to the query token's label slot."""
        return self.transformer.v[-1]

    @property
    def ready_size(self) -> int:
        """One support set plus the step's queries."""
        return self.support_size + self.queries_per_step

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> Tensor | None:
        """Predict a few incoming examples (online metric), store the chunk's tail, learn on the newest example(s)."""
        x, y, task_id = batch
        x = x.flatten(1)
        self.log_online_from_memory(x, y, run)
        tail = slice(-self.admit_last if self.admit_last is not None else None, None)
        self.buffer.add(x[tail], y[tail], task_id[tail])
        if not self.ready():
            return None
        idx = self.buffer.newest(self.support_size + self.queries_per_step)  # supports, then the newest as queries
        (sx, sy), (qx, qy) = self.buffer.get(idx[: self.support_size]), self.buffer.get(idx[self.support_size :])
        loss = self.loss(self.attend(qx, sx, sy), qy)
        run.step(loss)
        run.log_task_mean("train/loss", loss, qx.shape[0])
        return loss.detach()
