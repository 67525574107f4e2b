"""The one data module: serves task ``t`` as epoch ``t`` and builds the evaluation episodes (docs/protocol.md §2–3).

Training: epoch ``t`` is task ``t``'s training portion in arrival order, one chunk per batch, each example once.
Under DDP every chunk is split across the W ranks in equal shares: rank r takes examples r, r + W, … of the chunk's
first ``W · ⌊B / W⌋`` (as ``DistributedSampler(drop_last=True)`` does). Equal shares keep the ranks in lockstep: every
rank's replay buffer fills on the same chunk, so no rank steps alone and waits forever for the others' gradients.
Every rank evaluates every episode (the learner's scores are averaged over the ranks) and so logs the same keys.

Evaluation after task ``t``: forward (task ``t``), backward (task ``t − backward_lag``), the accuracy matrix after
each probe task, and the lifelong studies' optional slots (``lags``, ``recall_probe_from``, ``returns``,
``revisions``: docs/protocol.md §3); none after a warm-up epoch (:meth:`StreamDataModule.evaluated_task`, §2).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from cl_lightning.contract import Episode, EvalBatch, EvalSlot, QueryCount, StreamBatch, StreamSteps
from cl_lightning.data.stream import TaskStream, check_at_least


class ChunkDataset(IterableDataset):
    """The training chunks of one task (this rank's share of each), in arrival order; with ``steps > 1``,
    ``steps`` consecutive chunks per item as one :class:`StreamSteps` (one process, equal chunks)."""

    def __init__(self, stream: TaskStream, task: int, rank: int = 0, world_size: int = 1, steps: int = 1) -> None:
        self.stream, self.task, self.rank, self.world_size, self.steps = stream, task, rank, world_size, steps

    def __len__(self) -> int:
        """Batches of this task (a warm-up task has its held-out queries' chunks too)."""
        return -(-self.stream.task_num_chunks(self.task) // self.steps)

    def __iter__(self) -> Iterator[StreamBatch | StreamSteps]:
        """Yield ``StreamBatch`` chunks, this rank's equal share of each, or ``StreamSteps`` of ``steps`` chunks."""
        if self.steps > 1:
            yield from self._steps()
            return
        for i in range(len(self)):
            x, y, t = self.stream.chunk(self.task, i)
            end = x.shape[0] - x.shape[0] % self.world_size  # equal shares: drop the last B mod W examples
            sl = slice(self.rank, end, self.world_size)
            yield StreamBatch(x[sl], y[sl], t[sl])

    def _steps(self) -> Iterator[StreamSteps]:
        data, b = self.stream.task(self.task), self.stream.chunk_size
        n = self.stream.task_num_chunks(self.task)
        for i in range(0, n, self.steps):
            lo, hi = i * b, min(n, i + self.steps) * b
            x, y = data.train_x[lo:hi], data.train_y[lo:hi]  # (k·B, ...) -> (k, B, ...)
            yield StreamSteps(
                x.unflatten(0, (-1, b)), y.unflatten(0, (-1, b)), torch.full(x.shape[:1], self.task).view(-1, b)
            )


REVISION = ("revised", "stale")
"""Slots scored on an episode of their own: the task's queries of its revised keys (``revision_episode``)."""


class EpisodeDataset(IterableDataset):
    """The evaluation episodes, one per item: ``(evaluated task, slots its score is logged under)``; iterable, so
    Lightning does not shard it under DDP (every rank evaluates every episode)."""

    def __init__(
        self, stream: TaskStream, items: list[tuple[int, list[EvalSlot]]], context_size: int, queries: int | None
    ) -> None:
        self.stream, self.items, self.context_size, self.queries = stream, items, context_size, queries
        self.offset = stream.warmup_tasks  # evaluated task e is stream task offset + e

    def __len__(self) -> int:
        """Number of episodes: one per task, and one per revision slot (its own queries and answers)."""
        return sum(any(s.role not in REVISION for s in slots) + sum(s.role in REVISION for s in slots)
                   for _, slots in self.items)  # fmt: skip

    def __iter__(self) -> Iterator[EvalBatch]:
        """The episodes, their tasks and the slots the learner logs their scores under."""
        for task, slots in self.items:
            if slots[0].role == "written":  # its own episode: the task's written keys as queries
                yield EvalBatch(self.stream.written_episode(self.offset + task, self.context_size), task, tuple(slots))
                continue
            plain = tuple(s for s in slots if s.role not in REVISION)
            if plain:
                yield EvalBatch(self.stream.episode(self.offset + task, self.context_size, self.queries), task, plain)
            for slot in (s for s in slots if s.role in REVISION):
                answer = "old" if slot.role == "stale" else "new"
                episode = self.stream.revision_episode(self.offset + task, self.context_size, self.queries, answer)
                yield EvalBatch(episode, task, (slot,))


def _identity(item: Any) -> Any:
    return item


class StreamDataModule(LightningDataModule):
    """Serves a :class:`TaskStream` task by task, plus its evaluation episodes.

    Args:
        stream: The benchmark (``class_path`` in YAML).
        context_size: Labelled context examples per episode: the task's first training examples (SCR: its last).
        eval_queries: Held-out queries per episode (``None``: all of them).
        backward_lag: The backward metric evaluates task ``t − backward_lag``; a list averages over several lags
            (paper: 5 on image streams, [1, 2, 3, 4, 5] on slowly changing regression).
        num_probe_tasks: Evaluated tasks in the accuracy-matrix probe set (0 switches the matrix off).
        probe_span: Probe set over the first N evaluated tasks (None: all).
        lags: Lags L whose episodes (task ``t − L``) are also scored after task ``t``, each logged apart as
            ``eval/backward_{acc,mse}/lag_L`` (none by default).
        lag_tasks: Score ``lags`` after the last ``lag_tasks`` evaluated tasks only (``None``: after every task).
        recall_probe_from: From this evaluated task on, also score its written keys and its held-out queries
            (``eval/written_*``, ``eval/unseen_*``; ``AssociativeRecall``). ``None``: never.
        returns: Score the next task before it is shown (``eval/return_*/visit_n``; a stream with ``recur_every``).
        revisions: Score the task's revised keys, new and old values (``eval/revised_*``, ``eval/stale_*``).
        num_workers: DataLoader workers for the training chunks.
        steps_per_batch: Chunks per training batch in one process (one under several), each still one
            predict-then-learn step in arrival order (fewer round trips). More than 1 needs a learner with a step
            engine and chunks that divide a task (``learners.engines.check_steps``).
    """

    def __init__(
        self,
        stream: TaskStream,
        context_size: int = 1000,
        eval_queries: int | None = None,
        backward_lag: int | list[int] = 5,
        num_probe_tasks: int = 10,
        probe_span: int | None = None,
        num_workers: int = 0,
        steps_per_batch: int = 1,
        lags: list[int] | None = None,
        lag_tasks: int | None = None,
        recall_probe_from: int | None = None,
        returns: bool = False,
        revisions: bool = False,
    ) -> None:
        super().__init__()
        backward = [backward_lag] if isinstance(backward_lag, int) else list(backward_lag)
        if not backward:
            raise ValueError("backward_lag must name at least one lag (>= 1), got []")
        self.lags = sorted(set(lags or []))
        check_at_least(1, steps_per_batch=steps_per_batch, backward_lag=min(backward), eval_queries=eval_queries)
        check_at_least(1, lags=min(self.lags, default=None), lag_tasks=lag_tasks, probe_span=probe_span)
        check_at_least(
            0, context_size=context_size, num_probe_tasks=num_probe_tasks, recall_probe_from=recall_probe_from
        )
        self.steps_per_batch, self.lag_tasks, self.recall_probe_from = steps_per_batch, lag_tasks, recall_probe_from
        self.recur_every = stream.recur_every if returns else None
        if returns and self.recur_every is None:
            raise ValueError(f"returns needs a stream whose maps recur (recur_every set), got {type(stream).__name__}")
        if revisions and not getattr(stream, "revise", False):
            raise ValueError(f"revisions needs a stream that revises values (revise set), got {type(stream).__name__}")
        self.revisions = revisions
        self.stream = stream
        self.context_size, self.eval_queries = context_size, eval_queries
        self.backward_lags, self.num_workers = backward, num_workers
        n = min(self.num_evaluated_tasks, probe_span or self.num_evaluated_tasks)
        k = min(num_probe_tasks, n)
        self.probe_tasks = sorted({round(i * (n - 1) / max(1, k - 1)) for i in range(k)}) if k else []

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input."""
        return tuple(self.stream.input_shape)

    @property
    def num_outputs(self) -> int:
        """Classes or regression targets."""
        return self.stream.num_outputs

    @property
    def task_type(self) -> str:
        """``"classification"`` or ``"regression"``."""
        return self.stream.task_type

    @property
    def num_tasks(self) -> int:
        """Tasks in the stream, warm-up ones included: the run's number of epochs."""
        return self.stream.num_tasks

    @property
    def warmup_tasks(self) -> int:
        """The stream's warm-up tasks: the first epochs, never evaluated."""
        return self.stream.warmup_tasks

    @property
    def num_evaluated_tasks(self) -> int:
        """Tasks that are evaluated: ``num_tasks − warmup_tasks``, numbered from 0."""
        return self.num_tasks - self.warmup_tasks

    def evaluated_task(self, epoch: int) -> int | None:
        """The evaluated task trained in ``epoch`` (``epoch − warmup_tasks``), or ``None`` in a warm-up epoch."""
        return epoch - self.warmup_tasks if epoch >= self.warmup_tasks else None

    def prepare_data(self) -> None:
        """Load or fetch the benchmark's files once."""
        self.stream.prepare()

    def setup(self, stage: str) -> None:
        """Check that the Trainer runs one epoch per task, rebuilds the loaders every epoch, and that every rank gets
        a share of every chunk."""
        trainer = self.trainer
        if stage != "fit" or trainer is None:
            return
        if self.stream.chunk_size < trainer.world_size:
            raise ValueError(
                f"chunk_size {self.stream.chunk_size} cannot be split across {trainer.world_size} ranks: "
                "use chunks of at least one example per rank, or fewer devices"
            )
        self.check_epochs(trainer)

    def check_epochs(self, trainer: Trainer) -> None:
        """Refuse (``ValueError``) a Trainer that does not run one epoch per task of the stream, rebuilding the
        loaders every epoch (a ``fast_dev_run`` is not checked)."""
        if trainer.fast_dev_run:
            return
        if trainer.reload_dataloaders_every_n_epochs != 1:
            raise ValueError("trainer.reload_dataloaders_every_n_epochs must be 1 (each epoch serves a new task)")
        if trainer.max_epochs != self.num_tasks:
            raise ValueError(
                f"trainer.max_epochs ({trainer.max_epochs}) must equal data.stream.init_args.num_tasks "
                f"({self.num_tasks}): one epoch is one task; leave max_epochs unset and the CLI fills it in"
            )

    def chunks_per_batch(self, world_size: int) -> int:
        """Chunks a training batch serves in a run of ``world_size`` processes: ``steps_per_batch`` in one, one under
        several (a step engine's batch of chunks reduces no gradients between its steps; a chunk a batch learns the
        same steps)."""
        return self.steps_per_batch if world_size == 1 else 1

    def _task(self) -> int:
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        return min(epoch, self.num_tasks - 1)

    def train_dataloader(self) -> DataLoader:
        """The current task's chunks (batch = one chunk, already collated)."""
        rank = self.trainer.global_rank if self.trainer is not None else 0
        world = self.trainer.world_size if self.trainer is not None else 1
        dataset = ChunkDataset(self.stream, self._task(), rank, world, self.chunks_per_batch(world))
        return DataLoader(dataset, batch_size=None, num_workers=self.num_workers, persistent_workers=False)

    def _stream_task(self, task: int) -> int:
        """The stream task of evaluated task ``task`` (``IndexError`` outside the evaluated tasks)."""
        if not 0 <= task < self.num_evaluated_tasks:
            raise IndexError(f"evaluated task {task} outside 0..{self.num_evaluated_tasks - 1}")
        return self.warmup_tasks + task

    def episode(self, task: int, num_queries: QueryCount = "eval") -> Episode:
        """Evaluated task ``task``'s episode: ``context_size`` examples of the stream's :meth:`TaskStream.context` and
        its first ``num_queries`` held-out queries (``"eval"``, the default: ``eval_queries``, as the built-in
        evaluation scores; ``None``: all), on the CPU."""
        return self.stream.episode(self._stream_task(task), self.context_size, self._count(num_queries))

    def queries(self, task: int, num_queries: QueryCount = "eval") -> tuple[Tensor, Tensor]:
        """Evaluated task ``task``'s first ``num_queries`` held-out queries and their targets (as :meth:`episode`'s),
        on the CPU."""
        return self.stream.queries(self._stream_task(task), self._count(num_queries))

    def _count(self, num_queries: QueryCount) -> int | None:
        return self.eval_queries if num_queries == "eval" else num_queries

    def written_episode(self, task: int) -> Episode:
        """Evaluated task ``task``'s written keys as queries (the stream's
        :meth:`~cl_lightning.data.stream.TaskStream.written_episode`), with the data module's context, on the CPU."""
        return self.stream.written_episode(self._stream_task(task), self.context_size)

    def task_batches(self, task: int, max_examples: int | None = None) -> Iterator[StreamBatch]:
        """Stream task ``task``'s (epoch ``task``'s) whole training portion in arrival order, chunk by chunk, cut after
        ``max_examples`` (every rank sees all of it: a task-aware learner such as EWC computes the same statistics
        on every rank). A warm-up task's portion includes its held-out queries, as its training did."""
        budget = self.stream.task_train_size(task) if max_examples is None else max_examples
        for x, y, t in ChunkDataset(self.stream, task):  # one rank: whole chunks
            if budget <= 0:
                return
            yield StreamBatch(x[:budget], y[:budget], t[:budget])
            budget -= x.shape[0]

    def eval_items(self, epoch: int) -> list[tuple[int, list[EvalSlot]]]:
        """The evaluated tasks whose episodes are scored after epoch ``epoch`` and the slots each score is logged
        under (none after a warm-up epoch)."""
        task = self.evaluated_task(epoch)
        if task is None:
            return []
        items: dict[int, list[EvalSlot]] = {task: [EvalSlot("forward")]}
        if self.revisions and self.warmup_tasks + task >= 1:  # the stream's first task revises nothing
            items[task] += [EvalSlot("revised"), EvalSlot("stale")]
        for lag in self.backward_lags:  # several lags log under one name: Lightning averages them
            if task >= lag:
                items.setdefault(task - lag, []).append(EvalSlot("backward"))
        if self.lag_tasks is None or task >= self.num_evaluated_tasks - self.lag_tasks:
            for lag in self.lags:
                if task >= lag:
                    items.setdefault(task - lag, []).append(EvalSlot("lag", lag))
        if self.recur_every is not None and task + 1 < self.num_evaluated_tasks:
            visits = (self.warmup_tasks + task + 1) // self.recur_every  # showings of task t + 1's map so far
            items.setdefault(task + 1, []).append(EvalSlot("return", visits))
        if task in self.probe_tasks:
            for j in self.probe_tasks:
                items.setdefault(j, []).append(EvalSlot("matrix", j))
        if self.recall_probe_from is None or task < self.recall_probe_from:
            return sorted(items.items())
        items[task].append(EvalSlot("unseen"))  # the forward episode's queries, under their own name
        return [*sorted(items.items()), (task, [EvalSlot("written")])]  # a separate episode: the written keys

    def _episodes(self, items: list[tuple[int, list[EvalSlot]]]) -> DataLoader:
        dataset = EpisodeDataset(self.stream, items, self.context_size, self.eval_queries)
        return DataLoader(dataset, batch_size=None, collate_fn=_identity)

    def val_dataloader(self) -> DataLoader:
        """Episodes evaluated at the end of the current task; under the ``validate`` command (a checkpoint, no
        training), the final model's row like :meth:`test_dataloader`, logged as ``validate/...``."""
        if self.trainer is not None and self.trainer.state.fn == TrainerFn.VALIDATING:
            return self._episodes([(j, [EvalSlot("validated", j)]) for j in self.final_tasks()])
        return self._episodes(self.eval_items(self._task()))

    def test_dataloader(self) -> DataLoader:
        """The final model's row: every probe task's episode (:meth:`final_tasks`)."""
        return self._episodes([(j, [EvalSlot("final", j)]) for j in self.final_tasks()])

    def final_tasks(self) -> list[int]:
        """The tasks ``validate`` and ``test`` score: the probe tasks (the last row of the accuracy matrix), or the last
        evaluated task without a probe set."""
        return self.probe_tasks or [self.num_evaluated_tasks - 1]
