"""The task-stream contract every benchmark keeps (docs/protocol.md §1).

A stream is cheap to construct, knows its shapes, and regenerates any task from ``(seed, task)``: nothing per
task is stored, so task 7,499 costs what task 0 costs and a resumed run sees exactly the data an uninterrupted
run would.

Warm-up tasks (``warmup_tasks``, the paper's ``past_task_offset`` = 5) train on their whole data, the held-out
queries appended after the training portion, and are never evaluated; the stream numbers every task, the data module
only the evaluated ones (docs/protocol.md §2).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import NamedTuple

import torch
from torch import Tensor

from cl_lightning.contract import Episode, StreamBatch, TaskType


class TaskData(NamedTuple):
    """One task, fully materialised: the training portion in arrival order and the held-out queries."""

    train_x: Tensor
    train_y: Tensor
    query_x: Tensor
    query_y: Tensor


def check_at_least(low: float, **values: float | None) -> None:
    """Raise ``ValueError("<name> must be >= <low>, got <value>")`` for the first of ``values`` below ``low``; a value
    left unset (``None``) passes."""
    for name, value in values.items():
        if value is not None and value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")


def task_generator(seed: int, task: int, salt: int = 0) -> torch.Generator:
    """A CPU generator seeded from ``(seed, task)`` alone, so a task never depends on what ran before it."""
    return torch.Generator().manual_seed((seed * 1_000_003 + task * 7_919 + salt * 104_729) % (2**63 - 1))


class TaskStream(ABC):
    """Base class of the benchmarks: shapes, task count, chunking and deterministic task generation.

    Subclasses implement :meth:`generate` and set the shape attributes in ``__init__``.

    Args:
        num_tasks: Number of tasks in the stream (one epoch each).
        train_size: Training examples per evaluated task (a warm-up task trains on its held-out queries too).
        query_size: Held-out queries per task.
        chunk_size: Examples per training chunk (one learner step per chunk), at most ``train_size``.
        seed: Seed of the stream; task ``t`` is a pure function of ``(seed, t)``.
        cache_tasks: Generated tasks kept in memory (LRU): within a task the stream reads the current task and the
            backward episode's; others (probe rows) are regenerated.
        warmup_tasks: The first tasks that train on all their data (held-out queries included) and are never
            evaluated (paper: 5; default 0). At least one task must remain to evaluate.
        recur_every: If set, task ``t`` shows the map (permutation, key -> value map) of task ``t mod recur_every``,
            so every map returns after ``recur_every`` tasks (only streams that take the argument).
    """

    input_shape: tuple[int, ...]
    num_outputs: int
    task_type: TaskType

    def __init__(
        self,
        num_tasks: int,
        train_size: int,
        query_size: int,
        chunk_size: int,
        seed: int = 0,
        cache_tasks: int = 2,
        warmup_tasks: int = 0,
        recur_every: int | None = None,
    ) -> None:
        check_at_least(1, num_tasks=num_tasks, chunk_size=chunk_size, train_size=train_size, query_size=query_size)
        check_at_least(1, recur_every=recur_every)
        if chunk_size > train_size:
            raise ValueError(f"chunk_size {chunk_size} is larger than a task's train_size {train_size}")
        if not 0 <= warmup_tasks < num_tasks:
            raise ValueError(
                f"warmup_tasks must be in 0..num_tasks - 1 = {num_tasks - 1} (at least one task is evaluated), "
                f"got {warmup_tasks}"
            )
        self.num_tasks = num_tasks
        self.warmup_tasks = warmup_tasks
        self.chunk_size = chunk_size
        self.train_size, self.query_size = train_size, query_size
        self.recur_every = recur_every
        self.seed = seed
        self._cache: OrderedDict[int, TaskData] = OrderedDict()
        self._cache_tasks = max(1, cache_tasks)

    @abstractmethod
    def generate(self, task: int) -> TaskData:
        """Build task ``task`` from ``(self.seed, task)`` with tensor operations (no per-example Python loop)."""

    def map_of(self, task: int) -> int:
        """The task whose map ``task`` shows: itself, or ``task mod recur_every`` when maps recur."""
        return task if self.recur_every is None else task % self.recur_every

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Fetch or check the data on disk (called once, on rank 0); the default has nothing to fetch."""

    def task(self, task: int) -> TaskData:
        """Task ``task``, generated on first use and kept in a small LRU cache (a warm-up task's training portion is
        followed by its held-out queries, which it also keeps as queries)."""
        if not 0 <= task < self.num_tasks:
            raise IndexError(f"task {task} outside the stream's 0..{self.num_tasks - 1}")
        if task in self._cache:
            self._cache.move_to_end(task)
            return self._cache[task]
        data = self.generate(task)
        if task < self.warmup_tasks:
            train_x, train_y = torch.cat([data.train_x, data.query_x]), torch.cat([data.train_y, data.query_y])
            data = TaskData(train_x, train_y, data.query_x, data.query_y)
        self._cache[task] = data
        while len(self._cache) > self._cache_tasks:
            self._cache.popitem(last=False)
        return data

    @property
    def num_chunks(self) -> int:
        """Training chunks per evaluated task (the last one may be shorter)."""
        return math.ceil(self.train_size / self.chunk_size)

    def task_train_size(self, task: int) -> int:
        """Training examples of stream task ``task``: ``train_size``, plus the held-out queries on a warm-up task."""
        return self.task(task).train_x.shape[0] if task < self.warmup_tasks else self.train_size

    def task_num_chunks(self, task: int) -> int:
        """Training chunks of stream task ``task`` (the last one may be shorter)."""
        return math.ceil(self.task_train_size(task) / self.chunk_size)

    def chunk(self, task: int, index: int) -> StreamBatch:
        """Chunk ``index`` of task ``task``'s training portion (a warm-up task's whole data), in arrival order."""
        data = self.task(task)
        lo = index * self.chunk_size
        x, y = data.train_x[lo : lo + self.chunk_size], data.train_y[lo : lo + self.chunk_size]
        return StreamBatch(x, y, torch.full((x.shape[0],), task, dtype=torch.long))

    def context(self, data: TaskData, context_size: int) -> tuple[Tensor, Tensor]:
        """An episode's labelled context: the first ``context_size`` examples of the task's training portion (the
        paper takes it from there; a stream may take others)."""
        return data.train_x[:context_size], data.train_y[:context_size]

    def queries(self, task: int, num_queries: int | None = None) -> tuple[Tensor, Tensor]:
        """The first ``num_queries`` held-out queries of ``task`` (all with ``None``) and their targets."""
        data = self.task(task)
        return data.query_x[:num_queries], data.query_y[:num_queries]

    def episode(self, task: int, context_size: int, num_queries: int | None = None) -> Episode:
        """The evaluation episode of ``task``: the :meth:`context` and the :meth:`queries`, never trained on."""
        return Episode(*self.context(self.task(task), context_size), *self.queries(task, num_queries))

    def written_episode(self, task: int, context_size: int) -> Episode:
        """The episode of ``task``'s written keys (the clean keys its examples copy) as queries; only a stream that
        writes keys has one (:class:`~cl_lightning.data.AssociativeRecall`)."""
        raise ValueError(f"{type(self).__name__} writes no keys: it has no written-keys episode")
