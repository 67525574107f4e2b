"""Gated delta rule (Gated DeltaNet): a decayed state followed by an error-correcting write.

Yang, Kautz, Hatamizadeh (2025), "Gated Delta Networks: Improving Mamba2 with Delta Rule", arXiv:2412.06464.
Log-space gates g_t <= 0, alpha_t = exp(g_t), one per head and step; SGD on 1/2 ||S^T k_t - v_t||^2 plus weight
decay 1 - alpha_t, the prediction inside the write using the decayed state:

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T q_t                                        (prequential: o_t = S_{t-1}^T q_t, before the decay)

Chunked form, with b = cumsum(g) inside the chunk, Gamma_ij = exp(b_i - b_j) for j <= i and S the chunk-start state:

    A  = StrictTril(diag(beta) K K^T * Gamma)
    (I + A) [W | U] = [diag(beta * exp(b)) K | diag(beta) V]     (unit lower-triangular solve)
    U' = U - W S
    O_c = (Q * exp(b)) S + (Tril(Q K^T) * Gamma) U'
    S  <- exp(b_C) S + (K * exp(b_C - b))^T U'

Prequential: b is replaced by b^- (b^-_i = b_{i-1}, b^-_1 = 0) in the read, with StrictTril.
"""

import torch
from torch import Tensor

from cl_lightning.ops.utils import chunk_scan, decay_matrix, recurrent_scan, zero_state


def naive_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    initial_state: Tensor | None = None,
    prequential: bool = False,
) -> tuple[Tensor, Tensor]:
    """Gated delta rule, token-by-token reference: S_t = exp(g_t)(I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.

    Args:
        q, v, initial_state, prequential: As for every matrix-state rule (:mod:`cl_lightning.ops`, also the returns).
        k: Keys, shape (B, H, T, K); L2-normalise them (``l2_normalize``) for a stable write.
        beta: Learning rates beta_t, shape (B, H, T); in (0, 1) for a contractive write, (0, 2) is still stable.
        g: Log-space decay gates g_t <= 0, shape (B, H, T).
    """
    state = zero_state(q, v) if initial_state is None else initial_state

    def write(t: int, state: Tensor) -> Tensor:  # decay, then one LMS step per token
        state = g[:, :, t, None, None].exp() * state  # (B, H, K, V)
        k_t = k[:, :, t]  # (B, H, K)
        error = v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k_t, state)  # (B, H, V)
        return state + beta[:, :, t, None, None] * k_t.unsqueeze(-1) * error.unsqueeze(-2)

    return recurrent_scan(write, q, state, prequential)


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    initial_state: Tensor | None = None,
    prequential: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Gated delta rule, chunked WY/UT form: S_t = exp(g_t)(I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.

    The same numbers as :func:`naive_recurrent_gated_delta_rule`, the reference: arguments, shapes and returns as there.

    Args:
        chunk_size: Tokens per chunk C (keep C <= 64); any T works (the last chunk may be shorter).

    Example:
        >>> q, k, v = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 3)
        >>> beta, g = torch.rand(1, 2, 9), torch.nn.functional.logsigmoid(torch.randn(1, 2, 9))
        >>> o, state = chunk_gated_delta_rule(q, k, v, beta, g, chunk_size=4)
        >>> tuple(o.shape), tuple(state.shape)
        ((1, 2, 9, 3), (1, 2, 4, 3))
    """
    state = zero_state(q, v) if initial_state is None else initial_state

    def step(
        q_c: Tensor, k_c: Tensor, v_c: Tensor, beta_c: Tensor, g_c: Tensor, state: Tensor
    ) -> tuple[Tensor, Tensor]:
        b = g_c.cumsum(dim=2)  # (B, H, C)
        w, u = _wy_transform(k_c, v_c, beta_c, b)
        u = u - w @ state  # U' = U - W S: the write errors against the decayed chunk-start state
        b_read = b - g_c if prequential else b  # prequential reads S_{t-1}: cumulative gate up to t-1
        scores = (q_c @ k_c.transpose(-1, -2)) * decay_matrix(b_read, b, prequential)  # (B, H, C, C)
        o = (q_c * b_read.exp().unsqueeze(-1)) @ state + scores @ u
        b_last = b[:, :, -1:]  # (B, H, 1)
        decay_to_end = (b_last - b).exp().unsqueeze(-1)  # (B, H, C, 1)
        return o, b_last.exp().unsqueeze(-1) * state + (k_c * decay_to_end).transpose(-1, -2) @ u

    return chunk_scan(step, [q, k, v, beta, g], state, chunk_size)


def _wy_transform(k: Tensor, v: Tensor, beta: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """W (B, H, C, K) and U (B, H, C, V) of the UT transform, by one unit lower-triangular solve (no inverse)."""
    size, key_dim = k.shape[2], k.shape[3]
    k_beta = k * beta.unsqueeze(-1)  # (B, H, C, K)
    lower = (k_beta @ k.transpose(-1, -2) * decay_matrix(b, b, strict=False)).tril(-1)  # A, (B, H, C, C)
    lower = lower + torch.eye(size, dtype=lower.dtype, device=lower.device)
    rhs = torch.cat([k_beta * b.exp().unsqueeze(-1), v * beta.unsqueeze(-1)], dim=-1)  # (B, H, C, K + V)
    wu = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    w, u = wu.split([key_dim, wu.shape[-1] - key_dim], dim=-1)
    return w, u
