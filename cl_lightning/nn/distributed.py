"""Evaluation split across DDP ranks: an episode's queries are independent given the support set, so each rank
answers a contiguous block of them (the same predictions at ``1 / W`` of the arithmetic) and the answers are gathered.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor


def _check_same_episode(query_x: Tensor, support_x: Tensor, world_size: int) -> None:
    """Raise unless every rank holds the same episode (query count and checksums of the queries and supports)."""
    count = torch.tensor(float(query_x.shape[0]), dtype=torch.float64, device=query_x.device)
    sig = torch.stack([count, query_x.detach().double().sum(), support_x.detach().double().sum()])
    sigs = [torch.empty_like(sig) for _ in range(world_size)]
    dist.all_gather(sigs, sig)
    if any(not torch.equal(s, sigs[0]) for s in sigs):
        raise RuntimeError(
            "evaluation split across ranks needs every rank to evaluate the same episode, but the ranks hold different "
            "ones: set trainer.use_distributed_sampler=false so every rank receives every episode"
        )


def answer_across_ranks(fn: Callable[[Tensor], Tensor], query_x: Tensor, support_x: Tensor) -> Tensor:
    """``fn(query_x)`` computed in ``W`` contiguous query blocks, one per rank, and gathered on every rank.

    Args:
        fn: Answers a block of queries: ``(q, …) -> (q, …)`` (the support set is bound inside it).
        query_x: All the episode's queries, identical on every rank.
        support_x: The episode's support set (only checked to be the same on every rank).

    Returns:
        The answers to all queries, in order, on every rank (without a process group: ``fn(query_x)``).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return fn(query_x)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    _check_same_episode(query_x, support_x, world_size)
    n = query_x.shape[0]
    per = math.ceil(n / world_size)
    bounds = [(min(n, r * per), min(n, (r + 1) * per)) for r in range(world_size)]
    lo, hi = bounds[rank]
    local = fn(query_x[lo:hi])
    padded = local.new_zeros((per, *local.shape[1:]))
    padded[: hi - lo] = local
    parts = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[: b - a] for p, (a, b) in zip(parts, bounds, strict=True)])
