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
    """L2-normalise the last dimension: x / sqrt(sum(x^2) + eps) (fla's ``l2norm``, eps 1e-6).

    Args:
        x: Tensor of shape (..., D).
        eps: Added to the squared norm before the square root.

    Returns:
        Tensor of shape (..., D) with norm just below 1 (exactly 0 for a zero row).

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
    """Run ``step`` over consecutive time chunks, carrying the state; the last chunk may be shorter.

    Args:
        step: ``step(*chunk_inputs, state) -> (o_chunk, state)``; ``o_chunk`` has time on dim 2.
        inputs: Tensors with time on dim 2, i.e. (B, H, T, ...) or (B, H, T); ``None`` entries are passed through.
        state: The state at the start of the sequence.
        chunk_size: Number of time steps per chunk, at least 1.

    Returns:
        The chunk outputs concatenated along time, and the state after the last chunk.

    Raises:
        ValueError: If ``chunk_size`` < 1.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    first = next(x for x in inputs if x is not None)
    outputs = []
    # Loop over chunks only: the state recurrence between chunks is sequential.
    for start in range(0, first.shape[2], chunk_size):
        chunk = [None if x is None else x[:, :, start : start + chunk_size] for x in inputs]
        o, state = step(*chunk, state)
        outputs.append(o)
    return torch.cat(outputs, dim=2), state


def recurrent_scan(
    write: Callable[[int, Tensor], Tensor], q: Tensor, state: Tensor, prequential: bool
) -> tuple[Tensor, Tensor]:
    """The token loop of every matrix-state reference: o_t = S^T q_t, read before or after token t's update.

    Args:
        write: ``write(t, S) -> S``, token t's update of the state (B, H, K, V).
        q: Queries, shape (B, H, T, K).
        state: The state S_0 at the start of the sequence, shape (B, H, K, V).
        prequential: If True, o_t is read before token t's update (v_t never reaches o_t), otherwise after it.

    Returns:
        Outputs o of shape (B, H, T, V) and the final state S_T.
    """
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
    """Masked decay factors exp(b_out_i - b_in_j) for j <= i (j < i if ``strict``), 0 elsewhere.

    The difference is masked with -inf before ``exp``, so no factor exceeds 1 for log-gates <= 0 and no overflow (or
    NaN gradient) comes from the masked upper triangle.

    Args:
        b_out: Cumulative log-gates at the read positions i, shape (..., C, *F).
        b_in: Cumulative log-gates at the write positions j, shape (..., C, *F).
        strict: Drop the diagonal (prequential read).
        feature_dims: Number of trailing feature dims F (0 scalar gate, 1 per-key gate, 2 per key-value pair).

    Returns:
        Tensor of shape (..., C, C, *F).
    """
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
    """[W | U] solving (I + A) [W | U] = [left | right], A strictly lower triangular (the WY / UT transform).

    One unit lower-triangular solve, no inverse; the diagonal of ``strict_lower`` is never read.

    Args:
        strict_lower: A, shape (..., N, N).
        left: Right-hand side giving W, shape (..., N, K).
        right: Right-hand side giving U, shape (..., N, V).

    Returns:
        W of shape (..., N, K) and U of shape (..., N, V).
    """
    wu = torch.linalg.solve_triangular(strict_lower, torch.cat([left, right], dim=-1), upper=False, unitriangular=True)
    return wu.split([left.shape[-1], right.shape[-1]], dim=-1)


def masked_read_write(q: Tensor, k: Tensor, u: Tensor, state: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """A chunk's read O = Q S + (Q K^T masked) U and write S + K^T U, for the chunk-start state S.

    Args:
        q: Queries of the chunk, shape (B, H, C, K).
        k: Keys of the chunk's writes, shape (B, H, N, K).
        u: What each write adds (values, or delta-rule errors against S), shape (B, H, N, V).
        state: S, shape (B, H, K, V).
        mask: Boolean (C, N), which writes each query reads.

    Returns:
        Outputs of shape (B, H, C, V) and the state after the chunk, shape (B, H, K, V).
    """
    scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, 0.0)  # (B, H, C, N)
    return q @ state + scores @ u, state + k.transpose(-1, -2) @ u


def check_mini_batch_size(mini_batch_size: int) -> None:
    """Raise ValueError unless ``mini_batch_size`` >= 1."""
    if mini_batch_size < 1:
        raise ValueError(f"mini_batch_size must be >= 1, got {mini_batch_size}")


def mini_batch_rates(tau: Tensor, beta: Tensor, prequential: bool) -> Tensor:
    """E_ij = tau_i eta_j for j <= i (j < i, and tau shifted one row down, if ``prequential``), 0 elsewhere.

    The coefficients of the dual (chunked) form of mini-batch test-time training: read i sees the gradients of tokens
    j <= i taken at the mini-batch start, scaled by the position scale of the state it reads (W_{i-1} when
    prequential).

    Args:
        tau: Position scales tau_1..tau_M, shape (M,), M >= C.
        beta: Per-token rates eta_j of the mini-batch, shape (B, H, C).
        prequential: Read the state before token i's update.

    Returns:
        Tensor of shape (B, H, C, C).
    """
    size = beta.shape[-1]
    tau_c = tau[:size]
    tau_read = torch.cat([tau_c.new_zeros(1), tau_c[:-1]]) if prequential else tau_c  # read W_{i-1}
    eta = tau_read.unsqueeze(-1) * beta.unsqueeze(-2)  # (B, H, C, C)
    return eta.masked_fill(~causal_mask(size, prequential, beta.device), 0.0)


def expand_pairs(q: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Several key-value pairs per token, as a longer token sequence any linear-readout rule can run.

    Token t writes its P pairs (k_{t,1}, v_{t,1}) ... (k_{t,P}, v_{t,P}) one after another; it is read once, with the
    mean query q_t = mean_p q_{t,p}, at the position of its first pair, so a prequential read of token t sees every
    pair of the tokens before it and none of its own (o = S^T q is linear in q, so reading the mean query is the mean
    of the P readings). Take the outputs back with :func:`pair_outputs`.

    Args:
        q: Queries, shape (B, H, T, P, K).
        k: Keys, shape (B, H, T, P, K).
        v: Values, shape (B, H, T, P, V).
        beta: Write strengths, shape (B, H, T, P).

    Returns:
        q, k, v, beta of the expanded sequence of T * P steps: (B, H, T*P, K), (B, H, T*P, K), (B, H, T*P, V),
        (B, H, T*P); the queries are zero except at each token's first pair.
    """
    q_exp = torch.zeros_like(q)
    q_exp[:, :, :, 0] = q.mean(dim=3)
    return q_exp.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3), beta.flatten(2, 3)


def pair_outputs(o: Tensor, pairs: int) -> Tensor:
    """Outputs (B, H, T, V) of the tokens from the expanded sequence's outputs (B, H, T*P, V) (first pair of each)."""
    return o[:, :, ::pairs]
