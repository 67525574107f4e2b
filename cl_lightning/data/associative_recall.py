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
(L * num_items newer ones were written since); at smaller fractions a share min(1, L / p) of them has. Chance is
1 / num_classes. Everything is regenerated from ``(seed, task)``: an item is a pure function of (seed, slot, the task
at which the slot was last renewed).
"""

from __future__ import annotations

import torch

from cl_lightning.data.stream import TaskData, TaskStream, task_generator


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
        seed: int = 0,
    ) -> None:
        super().__init__(num_tasks=num_tasks, chunk_size=chunk_size, seed=seed)
        if num_items < 1 or num_classes < 2 or input_dim < 1 or train_size < 1 or query_size < 1 or noise < 0:
            raise ValueError("need num_items, input_dim, train_size, query_size >= 1, num_classes >= 2, noise >= 0")
        if not 0.0 < change_fraction <= 1.0:
            raise ValueError(f"change_fraction must be in (0, 1], got {change_fraction}")
        if chunk_size > train_size:
            raise ValueError(f"chunk_size {chunk_size} is larger than a task's train_size {train_size}")
        self.num_items, self.num_outputs, self.input_shape = num_items, num_classes, (input_dim,)
        self._train_size, self.query_size, self.noise = train_size, query_size, noise
        self.change_fraction = change_fraction
        self.period = max(1, round(1.0 / change_fraction))  # an item lives this many tasks
        order = torch.randperm(num_items, generator=task_generator(seed, 0, salt=7))
        self.offsets = order % self.period  # slot j is renewed at the tasks s with (s + offset_j) % period == 0

    @property
    def train_size(self) -> int:
        """Training examples per task."""
        return self._train_size

    def born(self, task: int) -> torch.Tensor:
        """The task at which each slot's current item appeared, shape (num_items,) (may be < 0: before the stream)."""
        return task - (task + self.offsets) % self.period

    def items(self, task: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The map of ``task``: item keys (num_items, input_dim) and their values (num_items,)."""
        born = self.born(task)
        dim = self.input_shape[0]
        keys, values = torch.empty(self.num_items, dim), torch.empty(self.num_items, dtype=torch.long)
        for s in born.unique().tolist():  # at most `period` draws per task, each for the slots renewed at task s
            gen = task_generator(self.seed, s, salt=11)
            all_keys = torch.randn(self.num_items, dim, generator=gen) / dim**0.5
            all_values = torch.randint(0, self.num_outputs, (self.num_items,), generator=gen)
            slots = born == s
            keys[slots], values[slots] = all_keys[slots], all_values[slots]
        return keys, values

    def generate(self, task: int) -> TaskData:
        """Noisy copies of the task's items in arrival order, and fresh noisy copies as queries."""
        keys, values = self.items(task)
        gen = task_generator(self.seed, task)
        n = self._train_size + self.query_size
        idx = torch.randint(0, self.num_items, (n,), generator=gen)
        x = keys[idx] + self.noise * torch.randn(n, self.input_shape[0], generator=gen) / self.input_shape[0] ** 0.5
        y = values[idx]
        k = self._train_size
        return TaskData(x[:k], y[:k], x[k:], y[k:])
