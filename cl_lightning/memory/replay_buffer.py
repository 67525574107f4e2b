"""A replay buffer with preallocated tensors: FIFO (the QOA paper) or reservoir sampling (Vitter's Algorithm R).

Everything lives in registered buffers at final shape, so a checkpoint holds the memory. Indices handed out are
*logical*: 0 is the oldest stored example and ``size - 1`` the newest (for reservoir mode, storage order).

No host synchronisation per step on an accelerator: the counters (``n_seen``, FIFO ``head``) have Python-int shadows,
reread on load, and class labels may have a host copy (:meth:`ReplayBuffer.keep_host_labels`) the samplers draw from.
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
        self._seen, self._head = 0, 0  # host shadows of n_seen and head (reread on load)
        self._host_y: Tensor | None = None  # host copy of the class labels: keep_host_labels()

    @property
    def holds_labels(self) -> bool:
        """Whether the targets are class labels (long scalars), not regression targets."""
        return self.y.dtype == torch.long and self.y.dim() == 1

    def keep_host_labels(self) -> None:
        """Keep a CPU copy of the class labels for :meth:`labels` (no device-to-host copy per step). Call it on an
        empty buffer of class labels."""
        if not self.holds_labels:
            raise ValueError("keep_host_labels() needs class labels (a buffer of long scalars)")
        if self._seen:
            raise RuntimeError("keep_host_labels() must be called before the first add()")
        self._host_y = torch.zeros(self.capacity, dtype=torch.long)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:  # type: ignore[override]
        """Load the tensors, then reread the host shadows from them (one host read per load, none per step)."""
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._seen, self._head = int(self.n_seen), int(self.head)
        if self._host_y is not None:
            self._host_y.copy_(self.y.cpu())

    def __len__(self) -> int:
        """Number of examples stored (at most ``capacity``)."""
        return min(self._seen, self.capacity)

    def physical(self, logical: Tensor) -> Tensor:
        """Map logical indices (0 = oldest) to storage slots (on ``logical``'s device)."""
        if self.mode == "reservoir" or self._seen < self.capacity:
            return logical
        return (logical + self._head) % self.capacity

    def get(self, logical: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs and targets at logical indices."""
        slots = self.physical(logical)
        return self.x[slots], self.y[slots]

    def labels(self, start: int = 0, stop: int | None = None) -> Tensor:
        """Stored targets at logical indices ``start .. stop - 1`` (default: all of them), in logical order; with
        :meth:`keep_host_labels` from the host copy, on the CPU."""
        stop = len(self) if stop is None else min(stop, len(self))
        if self._host_y is not None:
            return self._host_y[self.physical(torch.arange(start, max(start, stop)))]
        return self.y[self.physical(torch.arange(start, max(start, stop), device=self.x.device))]

    def newest(self, n: int) -> Tensor:
        """Logical indices of the ``n`` most recently stored examples (all of them if fewer are stored)."""
        size = len(self)
        return torch.arange(max(0, size - n), size, device=self.x.device)

    @torch.no_grad()
    def add(
        self,
        x: Tensor,
        y: Tensor,
        task_id: Tensor,
        generator: torch.Generator | None = None,
        host_y: Tensor | None = None,
    ) -> None:
        """Insert a chunk of examples in arrival order (reservoir mode draws slots from ``generator``); ``host_y``:
        with :meth:`keep_host_labels`, the chunk's CPU labels (else copied from ``y``, a host synchronisation)."""
        if self._host_y is not None and host_y is None:
            host_y = y.cpu()
        if self.mode == "fifo":
            self._add_fifo(x, y, task_id, host_y)
        else:
            self._add_reservoir(x, y, task_id, generator, host_y)
        self.n_seen += x.shape[0]
        self._seen += x.shape[0]

    def _write(self, slots: Tensor, x: Tensor, y: Tensor, task_id: Tensor) -> None:
        self.x[slots] = x.to(self.x.dtype)
        self.y[slots] = y.to(self.y.dtype)
        self.task_id[slots] = task_id

    def _add_fifo(self, x: Tensor, y: Tensor, task_id: Tensor, host_y: Tensor | None) -> None:
        n = x.shape[0]
        if n > self.capacity:  # only the newest `capacity` survive; keep the head arithmetic consistent
            self._head = (self._head + n - self.capacity) % self.capacity
            x, y, task_id = x[-self.capacity :], y[-self.capacity :], task_id[-self.capacity :]
            host_y = None if host_y is None else host_y[-self.capacity :]
            n = self.capacity
        self._write((torch.arange(n, device=self.x.device) + self._head) % self.capacity, x, y, task_id)
        if self._host_y is not None and host_y is not None:
            self._host_y[(torch.arange(n) + self._head) % self.capacity] = host_y.to(torch.long)
        self._head = (self._head + n) % self.capacity
        self.head.fill_(self._head)

    def _add_reservoir(
        self, x: Tensor, y: Tensor, task_id: Tensor, generator: torch.Generator | None, host_y: Tensor | None
    ) -> None:
        n = x.shape[0]
        ranks = torch.arange(self._seen, self._seen + n)  # global index of each incoming example
        # Algorithm R: example i fills slot i while there is room, else replaces slot j ~ U{0..i} if j < capacity.
        draws = (torch.rand(n, generator=generator, dtype=torch.float64) * (ranks + 1)).long()
        slots = torch.where(ranks < self.capacity, ranks, draws)
        keep = slots < self.capacity
        order = torch.arange(n)
        last = torch.full((self.capacity,), -1, dtype=torch.long)
        last.scatter_reduce_(0, slots[keep], order[keep], reduce="amax")  # later examples win a shared slot
        keep &= last[slots.clamp(max=self.capacity - 1)] == order
        slots, order = slots[keep], order[keep]  # host tensors: no device synchronisation
        if self._host_y is not None and host_y is not None:
            self._host_y[slots] = host_y[order].to(torch.long)
        dev = self.x.device
        slots, order = slots.to(dev, non_blocking=True), order.to(dev, non_blocking=True)
        self._write(slots, x[order], y[order.to(y.device)], task_id[order.to(task_id.device)])
