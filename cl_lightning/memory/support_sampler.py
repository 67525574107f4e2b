"""Support-set samplers: which buffer examples are queries and which are supports for one training step.

Both return *logical* buffer indices ``(query_idx (Q,), support_idx (S,))`` with no index in both, so a query is
never in its own support set.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

SamplerName = Literal["window", "uniform"]


def window_sample(
    labels: Tensor | None, size: int, window: int, num_queries: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """The authors' contiguous-window sampler (qoa-paper.md §2.4, PMNIST and Split code).

    A window of ``window`` contiguous stored examples is drawn uniformly; ``num_queries`` distinct classes present
    in it are drawn, and each one's *first* example in the window is a query; the supports are the window minus
    the first example of *every* class (990 supports for a window of 1,000 with 10 classes). Without labels
    (regression) the first ``num_queries`` examples are the queries and the rest the supports.

    Args:
        labels: Class labels of the stored examples in logical order (``None`` for regression).
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
    y = labels[start : start + window].cpu()
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


def sample_support(
    sampler: SamplerName,
    labels: Tensor | None,
    size: int,
    support_size: int,
    num_queries: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """Dispatch to :func:`window_sample` or :func:`uniform_sample`."""
    if sampler == "window":
        return window_sample(labels, size, support_size, num_queries, generator)
    return uniform_sample(size, support_size, num_queries, generator)
