"""Memory accounting for budget studies: every byte a learner must keep to answer a query, counted in one place
(:func:`memory_bytes`, and :func:`row_bytes` for a buffer's rows), split three ways:

- ``context``: what the learner keeps of the stream: a replay buffer's rows, or a fast-weight state with its routing
  state (``context_memory_bytes()``);
- ``fixed``: untrained state a query reads: a fixed random projection (named in the learner's ``fixed_buffers``);
- ``slow``: trained parameters, shown beside the budget, never in it.

``budget = context + fixed``. A buffer row is charged as stored (``precision="stored"``) or at the data's own
precision (``"data"``: exact 8-bit inputs and labels at 1 byte each, no task id, which kNN and QOA never read; a
Permuted-MNIST 7x7 row: 212 B stored, 50 B).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from cl_lightning.memory.replay_buffer import ReplayBuffer

Precision = Literal["stored", "data"]


@dataclass(frozen=True)
class MemoryBytes:
    """A learner's memory in bytes: ``context`` + ``fixed`` is what a budget counts, ``slow`` is shown beside."""

    context: int
    fixed: int
    slow: int

    @property
    def budget(self) -> int:
        """The bytes a budget study charges: context and fixed state (trained parameters excluded)."""
        return self.context + self.fixed


def input_value_bytes(x: Tensor) -> int:
    """Bytes per input value at the data's own precision: 1 where every value is an exact 8-bit value k / 255
    (or an integer 0-255), else the tensor's element size."""
    if x.is_floating_point():
        scaled = x.double() * 255  # a float32 k / 255 times 255 is k to ~1.5e-5
        if bool(((scaled - scaled.round()).abs() < 1e-3).all()) and bool(((x >= 0) & (x <= 1)).all()):
            return 1
        if bool(((x - x.round()).abs() == 0).all()) and bool(((x >= 0) & (x <= 255)).all()):
            return 1
    elif x.dtype == torch.uint8:
        return 1
    return x.element_size()


def label_bytes(num_outputs: int, classification: bool) -> int:
    """Bytes of one target at the data's precision: 1 for up to 256 classes, else float32 per output."""
    if classification:
        return 1 if num_outputs <= 256 else (2 if num_outputs <= 65536 else 4)
    return 4 * num_outputs


def row_bytes(
    input_shape: tuple[int, ...],
    num_outputs: int,
    *,
    classification: bool = True,
    precision: Precision = "stored",
    sample_x: Tensor | None = None,
) -> int:
    """Bytes of one buffer row: as stored (float32 x, int64 label, int64 task id) or at the data's precision
    (``sample_x``, e.g. a chunk of the stream, decides the inputs' bytes per value; labels per :func:`label_bytes`;
    no task id)."""
    width = math.prod(input_shape)
    if precision == "stored":
        target = 8 if classification else 4 * num_outputs
        return width * 4 + target + 8
    if precision != "data":
        raise ValueError(f"precision must be 'stored' or 'data', got {precision!r}")
    per_value = 4 if sample_x is None else input_value_bytes(sample_x)
    return width * per_value + label_bytes(num_outputs, classification)


def stream_row_bytes(stream, precision: Precision = "stored") -> int:
    """:func:`row_bytes` of a :class:`~cl_lightning.data.stream.TaskStream` (its first chunk decides the inputs'
    precision)."""
    classification = getattr(stream, "task_type", "classification") == "classification"
    sample = stream.chunk(0, 0).x if precision == "data" else None
    return row_bytes(stream.input_shape, stream.num_outputs, classification=classification, precision=precision,
                     sample_x=sample)  # fmt: skip


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes of ``tensors`` as stored."""
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_bytes(learner: nn.Module, row: int | None = None, *, held: bool = True) -> MemoryBytes:
    """Count a learner's memory (module docstring). A learner with a replay buffer is charged ``row`` bytes a row
    (default: as stored) for the rows it holds (``held``) or for its capacity; any other learner its
    ``context_memory_bytes()``. ``fixed``: the buffers a learner names in ``fixed_buffers``."""
    fixed = tensor_bytes(getattr(learner, name) for name in getattr(learner, "fixed_buffers", ()))
    slow = tensor_bytes(p for p in learner.parameters() if p.requires_grad)
    buffer = getattr(learner, "buffer", None)
    if isinstance(buffer, ReplayBuffer):
        if row is None:
            row = tensor_bytes((buffer.x[0], buffer.y[0], buffer.task_id[0]))
        rows = len(buffer) if held else buffer.capacity
        return MemoryBytes(context=rows * row, fixed=fixed, slow=slow)
    return MemoryBytes(context=int(learner.context_memory_bytes()), fixed=fixed, slow=slow)
