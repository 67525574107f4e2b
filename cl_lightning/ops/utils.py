"""Shared helpers for the parametric-attention ops: key normalisation, chunk loop, causal masks and decay matrices.

All ops use tensors laid out as (B, H, T, ...) with time on dim 2, the state convention S in R^{K x V} and the
readout o_t = S_t^T q_t (fla's convention).
"""

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

StateT = TypeVar("StateT")


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """L2-normalise the last dimension: x / sqrt(sum(x^2) + eps) (fla's ``l2norm``), ``(..., D) -> (..., D)``.

    Example:
        >>> l2_normalize(torch.tensor([[3.0, 4.0]]), eps=0.0)
        tensor([[0.6000, 0.8000]])
    """
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)


def chunk_scan(
    step: Callable[..., tuple[Tensor, StateT]],
    inputs: Sequence[Tensor | None],
    state: StateT,
    chunk_size: int,
) -> tuple[Tensor, StateT]:
    """``step(*chunk_inputs, state) -> (o_chunk, state)`` over consecutive chunks of ``chunk_size`` >= 1 steps of
    ``inputs`` (time on dim 2; ``None`` passed through; the last chunk may be shorter): the outputs concatenated along
    time, and the final state."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    first = next(x for x in inputs if x is not None)
    outputs = []
    for start in range(0, first.shape[2], chunk_size):  # sequential: the state carries from chunk to chunk
        chunk = [None if x is None else x[:, :, start : start + chunk_size] for x in inputs]
        o, state = step(*chunk, state)
        outputs.append(o)
    return torch.cat(outputs, dim=2), state


def recurrent_scan(
    write: Callable[[int, Tensor], Tensor], q: Tensor, state: Tensor, prequential: bool
) -> tuple[Tensor, Tensor]:
    """The token loop of every matrix-state reference: o_t = S^T q_t, read before (``prequential``) or after token
    t's update ``write(t, S) -> S``. ``q (B, H, T, K)``, ``state (B, H, K, V)`` -> ``o (B, H, T, V)``, S_T."""
    outputs = []
    for t in range(q.shape[2]):  # sequential reference: one update per token
        if prequential:
            outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
        state = write(t, state)
        if not prequential:
            outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outputs, dim=2), state


def causal_mask(size: int, strict: bool, device: torch.device) -> Tensor:
    """Boolean (size, size) mask keeping j <= i (``Tril``) or j < i (``StrictTril``, if ``strict``)."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril(-1 if strict else 0)


def decay_matrix(b_out: Tensor, b_in: Tensor, strict: bool, feature_dims: int = 0) -> Tensor:
    """exp(b_out_i - b_in_j) for j <= i (j < i if ``strict``), 0 elsewhere: cumulative log-gates at the reads and
    the writes ``(..., C, *F)`` -> ``(..., C, C, *F)``, with ``feature_dims`` trailing dims F. Masked with -inf
    before ``exp``, so the upper triangle neither overflows nor gives NaN gradients."""
    time = -1 - feature_dims
    diff = b_out.unsqueeze(time) - b_in.unsqueeze(time - 1)  # (..., C, 1, *F) - (..., 1, C, *F) -> (..., C, C, *F)
    mask = causal_mask(b_out.shape[time], strict, b_out.device)
    mask = mask.view(mask.shape + (1,) * feature_dims)  # (C, C, 1, ...)
    return diff.masked_fill(~mask, float("-inf")).exp()


def start_state(q: Tensor, v: Tensor, initial_state: Tensor | None) -> Tensor:
    """``initial_state``, or a zero state of shape (B, H, K, V) with the dtype and device of ``q`` if it is None."""
    if initial_state is not None:
        return initial_state
    batch, heads, _, key_dim = q.shape
    return q.new_zeros(batch, heads, key_dim, v.shape[-1])


def unit_lower_solve(strict_lower: Tensor, left: Tensor, right: Tensor) -> tuple[Tensor, Tensor]:
    """W ``(..., N, K)`` and U ``(..., N, V)`` solving (I + A) [W | U] = [left | right] for A ``(..., N, N)``
    strictly lower triangular (the WY / UT transform): one unit lower-triangular solve, A's diagonal never read."""
    wu = torch.linalg.solve_triangular(strict_lower, torch.cat([left, right], dim=-1), upper=False, unitriangular=True)
    return wu.split([left.shape[-1], right.shape[-1]], dim=-1)


def masked_read_write(q: Tensor, k: Tensor, u: Tensor, state: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """A chunk's read O = Q S + (Q K^T masked) U ``(B, H, C, V)`` and write S + K^T U ``(B, H, K, V)``, for queries
    ``q (B, H, C, K)``, the writes' keys ``k (B, H, N, K)`` and additions ``u (B, H, N, V)``, the chunk-start state
    S and ``mask (C, N)``, which writes each query reads."""
    scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, 0.0)  # (B, H, C, N)
    return q @ state + scores @ u, state + k.transpose(-1, -2) @ u


def check_mini_batch_size(mini_batch_size: int) -> None:
    if mini_batch_size < 1:
        raise ValueError(f"mini_batch_size must be >= 1, got {mini_batch_size}")


def mini_batch_rates(tau: Tensor, beta: Tensor, prequential: bool) -> Tensor:
    """The dual form's coefficients E_ij = tau_i eta_j for j <= i, 0 elsewhere (j < i and tau one row down if
    ``prequential``: read i then sees W_{i-1}): ``tau (M,)``, M >= C, ``beta (B, H, C)`` -> ``(B, H, C, C)``."""
    size = beta.shape[-1]
    tau_c = tau[:size]
    tau_read = torch.cat([tau_c.new_zeros(1), tau_c[:-1]]) if prequential else tau_c  # read W_{i-1}
    eta = tau_read.unsqueeze(-1) * beta.unsqueeze(-2)  # (B, H, C, C)
    return eta.masked_fill(~causal_mask(size, prequential, beta.device), 0.0)


def expand_pairs(q: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """P key-value pairs per token as a T*P-step sequence any linear-readout rule can run: ``(B, H, T, P, ...)`` ->
    ``(B, H, T*P, ...)`` for q, k, v, beta.

    Token t writes its P pairs one after another and is read once, at its first pair, with the mean query (o = S^T q
    is linear in q, so that is the mean of the P readings; the other queries are zero): a prequential read sees every
    pair of the tokens before it and none of its own. Take the outputs back with :func:`pair_outputs`.
    """
    q_exp = torch.zeros_like(q)
    q_exp[:, :, :, 0] = q.mean(dim=3)
    return q_exp.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3), beta.flatten(2, 3)


def pair_outputs(o: Tensor, pairs: int) -> Tensor:
    """Outputs (B, H, T, V) of the tokens from the expanded sequence's outputs (B, H, T*P, V) (first pair of each)."""
    return o[:, :, ::pairs]
