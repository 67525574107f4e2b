"""Lifelong associative recall: a key -> value map of which a fraction is replaced at every task.

An in-context stream for property (1) of lifelong in-context learning (an expressive, eviction-free memory): the
answer to a query is an association seen earlier in the stream, never a function of the input a network could
learn once. The map has ``num_items`` slots; slot j holds an item (a random key vector in R^{input_dim}) and its
value (a class in [num_classes]). At each task a fraction ``change_fraction`` of the slots gets a fresh item and a
fresh value (slot j is renewed at the tasks s with (s + offset_j) mod p = 0, p = round(1 / change_fraction), the
offsets spread evenly over the slots), so an item lives p tasks and then retires. A task's examples are noisy
copies of its items, ``x = item + noise * eps``, labelled with the item's value; its held-out queries are fresh noisy
copies of the same items.

So recall of task t - L's queries from a learner's memory after task t measures what it kept of associations that
were last seen L tasks ago: at ``change_fraction = 1`` every association of task t - L retired L tasks ago
(L * num_items newer ones were written since); at smaller fractions a share min(1, L / p) of them has. An item is a
pure function of (seed, slot, the task at which the slot was last renewed).

Two variants *reuse* keys, where the paper's first open question (regularising the online objective: forget gates,
weight decay, several heads) should pay:

- ``revise=True`` (partial revision): a renewed slot keeps its key and only gets a new value, different from its
  previous one (value = (a_j + n d_j) mod num_classes at the slot's n-th renewal, d_j in [1, num_classes)); the old
  association must be *forgotten*, since the same key now answers something else.
- ``recur_every=k`` (recurring maps): task t shows the map of task t mod k (fresh noisy copies), so every map
  returns after k tasks.

One variant probes whether a memory holds *concepts*, not only pairs (the paper's property P1):

- ``rule=True``: a task's values follow a rule, value = argmax(A_t key) for a random linear map A_t drawn per
  (map) task, and its held-out queries are *fresh* keys of the same distribution, never written, labelled by the
  same rule. A memory that captured A_t answers them; one that stores the written pairs answers them only as far
  as a nearby written key shares the query's value.
"""

from __future__ import annotations

from typing import Literal

import torch

from cl_lightning.contract import Episode
from cl_lightning.data.stream import TaskData, TaskStream, check_at_least, task_generator


class AssociativeRecall(TaskStream):
    """Noisy key -> value recall whose map drifts by ``change_fraction`` of its slots per task.

    Args:
        num_tasks: Tasks in the stream.
        num_items: Slots of the map (associations live at once).
        num_classes: Values (classes); chance is 1 / num_classes.
        input_dim: Width of an item's key vector (entries N(0, 1 / input_dim): norm about 1).
        train_size: Training examples per task (items drawn uniformly; each seen about train_size / num_items
            times).
        query_size: Held-out queries per task (fresh noisy copies of the task's items).
        chunk_size: Examples per training chunk.
        change_fraction: Share of slots renewed at each task, in (0, 1]; 1 makes every task a new map.
        noise: Relative noise of an example around its item (eps has the item's distribution).
        revise: A renewed slot keeps its key and gets a new value (partial revision) instead of a new item.
        recur_every: If set, task t shows the map of task t mod recur_every: maps recur.
        rule: Values are argmax(A_t key) for a per-task random linear map A_t, and the queries are fresh (unseen)
            keys labelled by the same rule (not with ``revise``).
        seed: Stream seed.
    """

    task_type = "classification"

    def __init__(
        self,
        num_tasks: int = 100,
        num_items: int = 16,
        num_classes: int = 10,
        input_dim: int = 32,
        train_size: int = 256,
        query_size: int = 128,
        chunk_size: int = 32,
        change_fraction: float = 1.0,
        noise: float = 0.1,
        revise: bool = False,
        recur_every: int | None = None,
        rule: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(num_tasks, train_size, query_size, chunk_size, seed=seed, recur_every=recur_every)
        check_at_least(1, num_items=num_items, input_dim=input_dim)
        check_at_least(2, num_classes=num_classes)
        check_at_least(0, noise=noise)
        if not 0.0 < change_fraction <= 1.0:
            raise ValueError(f"change_fraction must be in (0, 1], got {change_fraction}")
        if rule and revise:
            raise ValueError("rule and revise exclude each other: a revised key's new value would break the rule")
        self.num_items, self.num_outputs, self.input_shape = num_items, num_classes, (input_dim,)
        self.noise, self.change_fraction, self.revise, self.rule = noise, change_fraction, revise, rule
        self.period = max(1, round(1.0 / change_fraction))  # an item lives this many tasks
        order = torch.randperm(num_items, generator=task_generator(seed, 0, salt=7))
        self.offsets = order % self.period  # slot j is renewed at the tasks s with (s + offset_j) % period == 0
        gen = task_generator(seed, 0, salt=13)  # revise: fixed keys, value a_j + n d_j at the n-th renewal
        self.fixed_keys = torch.randn(num_items, input_dim, generator=gen) / input_dim**0.5
        self.value_base = torch.randint(0, num_classes, (num_items,), generator=gen)
        self.value_step = torch.randint(1, num_classes, (num_items,), generator=gen)

    def born(self, task: int) -> torch.Tensor:
        """The task at which each slot's current item appeared, shape (num_items,) (may be < 0: before the stream)."""
        task = self.map_of(task)
        return task - (task + self.offsets) % self.period

    def items(self, task: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The map of ``task``: item keys (num_items, input_dim) and their values (num_items,)."""
        born = self.born(task)
        if self.revise:
            renewals = torch.div(born + self.offsets, self.period, rounding_mode="floor")  # n, an integer
            return self.fixed_keys.clone(), (self.value_base + renewals * self.value_step) % self.num_outputs
        dim = self.input_shape[0]
        keys, values = torch.empty(self.num_items, dim), torch.empty(self.num_items, dtype=torch.long)
        for s in born.unique().tolist():  # at most `period` draws per task, each for the slots renewed at task s
            gen = task_generator(self.seed, s, salt=11)
            all_keys = torch.randn(self.num_items, dim, generator=gen) / dim**0.5
            all_values = torch.randint(0, self.num_outputs, (self.num_items,), generator=gen)
            slots = born == s
            keys[slots], values[slots] = all_keys[slots], all_values[slots]
        return keys, self.rule_values(task, keys) if self.rule else values

    def rule_values(self, task: int, keys: torch.Tensor) -> torch.Tensor:
        """``rule=True``: the values argmax(A_t key) of ``keys`` (N, input_dim) under the rule of ``task``'s map."""
        gen = task_generator(self.seed, self.map_of(task), salt=17)
        rule = torch.randn(self.num_outputs, self.input_shape[0], generator=gen)  # A_t, (C, D)
        return (keys @ rule.T).argmax(-1)

    def written_episode(self, task: int, context_size: int) -> Episode:
        """The task's items as queries (clean keys and their values), the first ``context_size`` training examples
        as context: recall of what the task wrote."""
        data, (keys, values) = self.task(task), self.items(task)
        return Episode(*self.context(data, context_size), keys, values)

    def unseen_keys(self, task: int) -> torch.Tensor:
        """``rule=True``: the task's held-out query keys, fresh draws never written, (query_size, input_dim)."""
        dim = self.input_shape[0]
        return torch.randn(self.query_size, dim, generator=task_generator(self.seed, task, salt=19)) / dim**0.5

    def slots(self, task: int, gen: torch.Generator | None = None) -> torch.Tensor:
        """The slot of each of the task's examples, training ones then queries: ``(train_size + query_size,)``, the
        first draw of the task's generator (``gen``: :meth:`generate`'s, which then draws the noise)."""
        gen = task_generator(self.seed, task) if gen is None else gen
        return torch.randint(0, self.num_items, (self.train_size + self.query_size,), generator=gen)

    def revision_episode(
        self, task: int, context_size: int, num_queries: int | None = None, answer: Literal["new", "old"] = "new"
    ) -> Episode:
        """``revise=True``: :meth:`episode` of ``task`` (>= 1) cut to the queries whose key was revised at this task,
        answered with the key's new value or, ``answer="old"``, with the one it had at task − 1 (the stale answer)."""
        if not self.revise or task < 1:
            raise ValueError(f"a revision episode needs revise=True and a task >= 1, got revise={self.revise}, {task}")
        episode = self.episode(task, context_size, num_queries)
        slots = self.slots(task)[self.train_size :][: episode.query_x.shape[0]]  # the queries' slots
        revised = (self.born(task) == task)[slots]
        targets = episode.query_y if answer == "new" else self.items(task - 1)[1][slots]
        return episode._replace(query_x=episode.query_x[revised], query_y=targets[revised])

    def generate(self, task: int) -> TaskData:
        """Noisy copies of the task's items in arrival order, and fresh noisy copies as queries."""
        keys, values = self.items(task)
        gen = task_generator(self.seed, task)
        idx, dim, k = self.slots(task, gen), self.input_shape[0], self.train_size
        x = keys[idx] + self.noise * torch.randn(idx.shape[0], dim, generator=gen) / dim**0.5
        y = values[idx]
        if self.rule:  # the queries: unseen keys under the task's rule
            unseen = self.unseen_keys(task)
            return TaskData(x[:k], y[:k], unseen, self.rule_values(task, unseen))
        return TaskData(x[:k], y[:k], x[k:], y[k:])
