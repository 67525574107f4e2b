"""The base of the learners whose memory is a replay buffer (kNN, query-only attention, full attention, MAML).

What they share: a buffer of the stream's examples (inputs stored flat), an online metric predicted from the newest
stored examples before the chunk is stored, episodes answered from the first ``support_size`` context examples (or,
with no context, the newest stored ones), and no step while the memory fills. That is DDP-safe: they optimise
manually (Lightning refuses a skipped automatic step under DDP), and every rank gets an equal share of every chunk, so
every rank's readiness (drawn from the same ``(seed, step)``) flips on the same chunk: no rank calls backward alone.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, Literal

import torch
from torch import Tensor

from cl_lightning.contract import StreamBatch
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.learners.engines import StepRun
from cl_lightning.memory.replay_buffer import ReplayBuffer


class ReplayLearner(ContinualLearner):
    """A learner answering from a support set drawn from its replay buffer (manual optimisation).

    Subclasses implement :meth:`predict_support` (predictions for queries given a support set), ``learn_chunk``
    (usually :meth:`log_online_from_memory`, ``self.buffer.add``, then ``run.step`` once :meth:`ready`) and
    :meth:`output_layer`; learners that step override :attr:`ready_size`.

    Args:
        memory_size: Buffer capacity.
        buffer_mode: ``"fifo"`` or ``"reservoir"``.
        support_size: Supports per prediction while training (drawn from the buffer) and the most an evaluation
            episode's context lends (its first ``min(support_size, data.context_size)``; not linked: the paper's
            settings differ on purpose, e.g. full attention's 99 supports against episodes of 100).
        online_queries: Incoming examples per chunk predicted before they are stored, for the online metric.
        **kwargs: :class:`~cl_lightning.learners.base.ContinualLearner`'s: the linked shapes, ``optimizer`` and
            ``seed`` (the learner's draws depend on ``(seed, step)`` only).
    """

    def __init__(
        self,
        *,
        memory_size: int = 1000,
        buffer_mode: Literal["fifo", "reservoir"] = "fifo",
        support_size: int = 1000,
        online_queries: int = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if support_size < 1 or online_queries < 0:
            raise ValueError("support_size must be >= 1 and online_queries >= 0")
        if support_size > memory_size:
            raise ValueError(f"support_size {support_size} is larger than memory_size {memory_size}")
        self.support_size, self.online_queries = support_size, online_queries
        classification = self.task_type == "classification"
        y_shape, y_dtype = ((), torch.long) if classification else ((self.num_outputs,), torch.float32)
        self.buffer = ReplayBuffer(memory_size, (math.prod(self.input_shape),), y_shape, buffer_mode, y_dtype)
        self._host_batch_y: Tensor | None = None  # the running chunk's labels before their transfer to the device

    def on_before_batch_transfer(self, batch: object, dataloader_idx: int) -> object:
        """Keep the CPU labels of a training chunk before Lightning moves it to the device (:meth:`host_labels`)."""
        if isinstance(batch, StreamBatch):
            self._host_batch_y = batch.y
        return batch

    def host_labels(self, y: Tensor) -> Tensor | None:
        """The CPU copy of the chunk labels ``y`` kept by :meth:`on_before_batch_transfer` (taken once), or ``None``
        when there is none of ``y``'s shape (``training_step`` called outside Lightning)."""
        host, self._host_batch_y = self._host_batch_y, None
        return host if host is not None and host.shape == y.shape and host.device.type == "cpu" else None

    @abstractmethod
    def predict_support(self, query_x: Tensor, support_x: Tensor, support_y: Tensor) -> Tensor:
        """Logits or values ``(Q, C)`` for flat queries ``(Q, D)`` given flat supports ``(S, D)`` and targets."""

    @property
    def ready_size(self) -> int:
        """Examples the buffer must hold before the learner takes its first step (default: one support set)."""
        return self.support_size

    def ready(self) -> bool:
        """Whether the buffer holds :attr:`ready_size` examples (the same answer on every DDP rank)."""
        return len(self.buffer) >= self.ready_size

    def online_ready(self) -> bool:
        """Whether the buffer can answer the online metric: a full support set by default."""
        return len(self.buffer) >= self.support_size

    def memory_support(self) -> tuple[Tensor, Tensor]:
        """The newest ``support_size`` stored examples (all of them if fewer are stored): ``(S, D)``, targets."""
        return self.buffer.get(self.buffer.newest(self.support_size))

    def log_online_from_memory(self, x: Tensor, y: Tensor, run: StepRun) -> None:
        """Predict the first ``online_queries`` incoming examples from :meth:`memory_support` and log the online
        metric, before the chunk is stored (nothing is logged until :meth:`online_ready`)."""
        if not self.online_queries or not self.online_ready():
            return
        with torch.no_grad():
            sx, sy = self.memory_support()
            k = min(self.online_queries, x.shape[0])
            run.log_online(self.predict_support(x[:k], sx, sy), y[:k])

    def episode_support(self, context_x: Tensor, context_y: Tensor) -> tuple[Tensor, Tensor]:
        """The support set of an episode: its first ``support_size`` context examples, flat, or with no context the
        newest stored ones."""
        if context_x.shape[0] == 0:
            return self.memory_support()
        return context_x[: self.support_size].flatten(1), context_y[: self.support_size]

    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """Predict the queries from :meth:`episode_support`."""
        return self.predict_support(query_x.flatten(1), *self.episode_support(context_x, context_y))
