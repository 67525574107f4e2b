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

from cl_lightning.ops.utils import (
    causal_mask,
    chunk_scan,
    decay_matrix,
    masked_read_write,
    recurrent_scan,
    start_state,
    unit_lower_solve,
)


def naive_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    initial_state: Tensor | None = None,
    prequential: bool = False,
) -> tuple[Tensor, Tensor]:
    """Gated delta rule, token-by-token reference: S_t = exp(g_t)(I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.

    Args:
        q, k, v, beta, initial_state, prequential: As for the delta rule, the rule with g = 0
            (:func:`~cl_lightning.ops.delta_rule.naive_recurrent_delta_rule`).
        g: Log-space decay gates g_t <= 0, shape (B, H, T); None means no decay (the delta rule runs this code with it).
    """
    state = start_state(q, v, initial_state)

    def write(t: int, state: Tensor) -> Tensor:  # (decay, then) one LMS step per token
        if g is not None:
            state = g[:, :, t, None, None].exp() * state  # (B, H, K, V)
        k_t = k[:, :, t]  # (B, H, K)
        error = v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k_t, state)  # (B, H, V)
        return state + beta[:, :, t, None, None] * k_t.unsqueeze(-1) * error.unsqueeze(-2)  # (B, H, K, V)

    return recurrent_scan(write, q, state, prequential)


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    initial_state: Tensor | None = None,
    prequential: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Gated delta rule, chunked WY/UT form: S_t = exp(g_t)(I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.

    As :func:`naive_recurrent_gated_delta_rule` (arguments, shapes, numbers); ``chunk_size`` C <= 64, any T.

    Example:
        >>> q, k, v = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 3)
        >>> beta, g = torch.rand(1, 2, 9), torch.nn.functional.logsigmoid(torch.randn(1, 2, 9))
        >>> o, state = chunk_gated_delta_rule(q, k, v, beta, g, chunk_size=4)
        >>> tuple(o.shape), tuple(state.shape)
        ((1, 2, 9, 3), (1, 2, 4, 3))
    """
    state = start_state(q, v, initial_state)

    def step(
        q_c: Tensor, k_c: Tensor, v_c: Tensor, beta_c: Tensor, g_c: Tensor | None, state: Tensor
    ) -> tuple[Tensor, Tensor]:
        k_beta, v_beta = k_c * beta_c.unsqueeze(-1), v_c * beta_c.unsqueeze(-1)  # (B, H, C, K), (B, H, C, V)
        gram = k_beta @ k_c.transpose(-1, -2)  # diag(beta) K K^T, (B, H, C, C)
        if g_c is None:  # the delta rule: A = StrictTril(diag(beta) K K^T), O_c = Q S + Tril(Q K^T) U'
            w, u = unit_lower_solve(gram.tril(-1), k_beta, v_beta)
            u = u - w @ state  # U' = U - W S: the write errors against the chunk-start state
            return masked_read_write(q_c, k_c, u, state, causal_mask(q_c.shape[2], prequential, q_c.device))
        b = g_c.cumsum(dim=2)  # (B, H, C)
        lower = (gram * decay_matrix(b, b, strict=False)).tril(-1)  # A, (B, H, C, C)
        w, u = unit_lower_solve(lower, k_beta * b.exp().unsqueeze(-1), v_beta)
        u = u - w @ state  # U' = U - W S: the write errors against the decayed chunk-start state
        b_read = b - g_c if prequential else b  # prequential reads S_{t-1}: cumulative gate up to t-1
        scores = (q_c @ k_c.transpose(-1, -2)) * decay_matrix(b_read, b, prequential)  # (B, H, C, C)
        o = (q_c * b_read.exp().unsqueeze(-1)) @ state + scores @ u
        b_last = b[:, :, -1:]  # (B, H, 1)
        decay_to_end = (b_last - b).exp().unsqueeze(-1)  # (B, H, C, 1)
        return o, b_last.exp().unsqueeze(-1) * state + (k_c * decay_to_end).transpose(-1, -2) @ u

    return chunk_scan(step, [q, k, v, beta, g], state, chunk_size)
