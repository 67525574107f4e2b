"""A replay buffer with preallocated tensors: FIFO (the QOA paper) or reservoir sampling (Vitter's Algorithm R).

Everything lives in registered buffers at final shape, so a checkpoint holds the memory and a resumed run
continues with exactly the same contents. Indices handed out are *logical*: 0 is the oldest stored example and
``size - 1`` the newest (for reservoir mode, storage order).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn


class ReplayBuffer(nn.Module):
    """Fixed-capacity example memory.

    Args:
        capacity: Number of examples kept.
        x_shape: Shape of one input.
        y_shape: Shape of one target: ``()`` for class labels (stored as long), ``(k,)`` for regression targets.
        mode: ``"fifo"`` keeps the newest ``capacity`` examples; ``"reservoir"`` keeps a uniform sample of all
            examples seen (each with probability ``capacity / n_seen``).
        y_dtype: Dtype of the targets (long for classification, float for regression).
    """

    def __init__(
        self,
        capacity: int,
        x_shape: tuple[int, ...],
        y_shape: tuple[int, ...] = (),
        mode: Literal["fifo", "reservoir"] = "fifo",
        y_dtype: torch.dtype = torch.long,
    ) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"replay buffer capacity must be >= 1, got {capacity}")
        if mode not in ("fifo", "reservoir"):
            raise ValueError(f"buffer mode must be 'fifo' or 'reservoir', got {mode!r}")
        self.capacity = capacity
        self.mode = mode
        self.register_buffer("x", torch.zeros(capacity, *x_shape))
        self.register_buffer("y", torch.zeros(capacity, *y_shape, dtype=y_dtype))
        self.register_buffer("task_id", torch.full((capacity,), -1, dtype=torch.long))
        self.register_buffer("n_seen", torch.zeros((), dtype=torch.long))
        self.register_buffer("head", torch.zeros((), dtype=torch.long))  # FIFO: next physical slot to write

    def __len__(self) -> int:
        """Number of examples stored (at most ``capacity``)."""
        return int(min(int(self.n_seen), self.capacity))

    def physical(self, logical: Tensor) -> Tensor:
        """Map logical indices (0 = oldest) to storage slots."""
        if self.mode == "reservoir" or int(self.n_seen) < self.capacity:
            return logical
        return (logical + self.head) % self.capacity

    def get(self, logical: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs and targets at logical indices."""
        slots = self.physical(logical)
        return self.x[slots], self.y[slots]

    def labels(self, start: int = 0, stop: int | None = None) -> Tensor:
        """Stored targets at logical indices ``start .. stop - 1`` (default: all of them), in logical order.

        A sampler that reads one window passes its range, so a step gathers ``window`` labels, not the whole buffer.
        """
        stop = len(self) if stop is None else min(stop, len(self))
        return self.y[self.physical(torch.arange(start, max(start, stop), device=self.x.device))]

    def newest(self, n: int) -> Tensor:
        """Logical indices of the ``n`` most recently stored examples (all of them if fewer are stored)."""
        size = len(self)
        return torch.arange(max(0, size - n), size, device=self.x.device)

    @torch.no_grad()
    def add(self, x: Tensor, y: Tensor, task_id: Tensor, generator: torch.Generator | None = None) -> None:
        """Insert a chunk of examples in arrival order (reservoir mode draws slots from ``generator``)."""
        if self.mode == "fifo":
            self._add_fifo(x, y, task_id)
        else:
            self._add_reservoir(x, y, task_id, generator)
        self.n_seen += x.shape[0]

    def _write(self, slots: Tensor, x: Tensor, y: Tensor, task_id: Tensor) -> None:
        self.x[slots] = x.to(self.x.dtype)
        self.y[slots] = y.to(self.y.dtype)
        self.task_id[slots] = task_id

    def _add_fifo(self, x: Tensor, y: Tensor, task_id: Tensor) -> None:
        n = x.shape[0]
        if n > self.capacity:  # only the newest `capacity` survive; keep the head arithmetic consistent
            self.head += n - self.capacity
            x, y, task_id = x[-self.capacity :], y[-self.capacity :], task_id[-self.capacity :]
            n = self.capacity
        slots = (self.head + torch.arange(n, device=self.x.device)) % self.capacity
        self._write(slots, x, y, task_id)
        self.head.copy_((self.head + n) % self.capacity)

    def _add_reservoir(self, x: Tensor, y: Tensor, task_id: Tensor, generator: torch.Generator | None) -> None:
        n = x.shape[0]
        seen = int(self.n_seen)
        ranks = torch.arange(seen, seen + n)  # global index of each incoming example
        # Algorithm R: example i fills slot i while there is room, else replaces slot j ~ U{0..i} if j < capacity.
        draws = (torch.rand(n, generator=generator, dtype=torch.float64) * (ranks + 1)).long()
        slots = torch.where(ranks < self.capacity, ranks, draws)
        keep = slots < self.capacity
        order = torch.arange(n)
        last = torch.full((self.capacity,), -1, dtype=torch.long)
        last.scatter_reduce_(0, slots[keep], order[keep], reduce="amax")  # later examples win a shared slot
        keep &= last[slots.clamp(max=self.capacity - 1)] == order
        dev = self.x.device
        self._write(slots[keep].to(dev), x[keep.to(x.device)], y[keep.to(y.device)], task_id[keep.to(task_id.device)])
