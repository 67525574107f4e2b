"""Support-set samplers: which buffer examples are queries and which are supports for one training step.

All return *logical* buffer indices ``(query_idx (Q,), support_idx (S,))`` with no index in both, so a query is
never in its own support set. :func:`draw_support` draws them for a :class:`~cl_lightning.memory.ReplayBuffer` and
gathers the examples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from cl_lightning.memory.replay_buffer import ReplayBuffer

SamplerName = Literal["window", "uniform", "sliding"]
LabelSource = Tensor | Callable[[int, int], Tensor] | None


def window_sample(
    labels: LabelSource, size: int, window: int, num_queries: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """The authors' contiguous-window sampler (docs/qoa.md §4, PMNIST and Split code).

    A window of ``window`` contiguous stored examples is drawn uniformly; ``num_queries`` distinct classes present
    in it are drawn, and each one's *first* example in the window is a query; the supports are the window minus
    the first example of *every* class (990 supports for a window of 1,000 with 10 classes). Without labels
    (regression) the first ``num_queries`` examples are the queries and the rest the supports.

    Args:
        labels: Class labels of the stored examples in logical order, or a function ``(start, stop) -> labels`` of
            that range (``ReplayBuffer.labels``: only the window is gathered); ``None`` for regression.
        size: Number of stored examples.
        window: Window length (the paper's ``support_size``).
        num_queries: Queries per step (paper: 1).
        generator: Source of randomness, seeded from ``(seed, step)``.
    """
    if window > size:
        raise ValueError(f"window {window} is larger than the {size} stored examples")
    start = int(torch.randint(0, size - window + 1, (1,), generator=generator))
    idx = torch.arange(start, start + window)
    if labels is None:
        return idx[:num_queries], idx[num_queries:]
    y = (labels(start, start + window) if callable(labels) else labels[start : start + window]).cpu()
    n_cls = int(y.max()) + 1
    first = torch.full((n_cls,), window, dtype=torch.long)
    first.scatter_reduce_(0, y, torch.arange(window), reduce="amin")  # first position of each class
    present = first[first < window]
    chosen = present[torch.randperm(present.numel(), generator=generator)[:num_queries]]
    is_first = torch.zeros(window, dtype=torch.bool)
    is_first[present] = True
    return idx[chosen], idx[~is_first]


def uniform_sample(size: int, support_size: int, num_queries: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Distinct uniform draws from the buffer: the first ``num_queries`` are queries, the next ones supports."""
    if support_size + num_queries > size:
        raise ValueError(f"{support_size} supports + {num_queries} queries exceed the {size} stored examples")
    idx = torch.randperm(size, generator=generator)[: support_size + num_queries]
    return idx[:num_queries], idx[num_queries:]


def sliding_sample(size: int, support_size: int, num_queries: int) -> tuple[Tensor, Tensor]:
    """The paper's slowly-changing-regression sampler (docs/qoa.md §4, Algorithm 1), no randomness: the queries are
    the ``num_queries`` newest stored examples, the supports the ``support_size`` stored just before them."""
    if support_size + num_queries > size:
        raise ValueError(f"{support_size} supports + {num_queries} queries exceed the {size} stored examples")
    idx = torch.arange(size - num_queries - support_size, size)
    return idx[support_size:], idx[:support_size]


def sample_support(
    sampler: SamplerName,
    labels: LabelSource,
    size: int,
    support_size: int,
    num_queries: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """Dispatch to :func:`window_sample`, :func:`uniform_sample` or :func:`sliding_sample`."""
    if sampler == "window":
        return window_sample(labels, size, support_size, num_queries, generator)
    if sampler == "sliding":
        return sliding_sample(size, support_size, num_queries)
    return uniform_sample(size, support_size, num_queries, generator)


def query_is_incoming(sampler: SamplerName, buffer: ReplayBuffer, num_queries: int, chunk_size: int) -> bool:
    """Whether the step after a chunk of ``chunk_size`` is stored in ``buffer`` takes the chunk's one example as its
    query and the ``support_size`` examples stored just before it as its supports: :func:`sliding_sample` over a FIFO,
    one example a chunk, one query a step."""
    return sampler == "sliding" and buffer.mode == "fifo" and num_queries == 1 and chunk_size == 1


def draw_support(
    buffer: ReplayBuffer, sampler: SamplerName, support_size: int, num_queries: int, generator: torch.Generator
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """One training step's queries and supports from ``buffer``: ``((query_x, query_y), (support_x, support_y))``,
    indices drawn on the host (:func:`sample_support`) and the examples gathered on the buffer's device."""
    labels = buffer.labels if buffer.holds_labels else None
    q_idx, s_idx = sample_support(sampler, labels, len(buffer), support_size, num_queries, generator)
    device = buffer.x.device
    q_idx, s_idx = q_idx.to(device, non_blocking=True), s_idx.to(device, non_blocking=True)
    return buffer.get(q_idx), buffer.get(s_idx)


def pseudo_task_sample(
    size: int, num_pseudo_tasks: int, support_size: int, query_size: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """MAML-with-replay pseudo-tasks (docs/baselines.md §6, authors' code): contiguous slices of equal buffer regions.

    The ``size`` stored examples (logical order, oldest first) are cut into ``num_pseudo_tasks`` equal contiguous
    regions (the last ``size mod num_pseudo_tasks`` examples belong to none); in each a start is drawn uniformly, the
    next ``support_size`` examples are the support slice and the ``query_size`` after them the query slice.

    Returns:
        ``query_idx (T, query_size)`` and ``support_idx (T, support_size)``, logical buffer indices.
    """
    region, span = size // num_pseudo_tasks, support_size + query_size
    if region < span:
        raise ValueError(f"{size} stored examples in {num_pseudo_tasks} regions leave fewer than {span} per region")
    offsets = torch.randint(0, region - span + 1, (num_pseudo_tasks,), generator=generator)  # the start in each region
    idx = (torch.arange(num_pseudo_tasks) * region + offsets)[:, None] + torch.arange(span)  # (T, s + q)
    return idx[:, support_size:], idx[:, :support_size]
