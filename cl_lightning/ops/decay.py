"""Decay / gated linear attention with a scalar gate (RetNet, Mamba-2 style) or a per-key vector gate (GLA).

Sun et al. (2023), "Retentive Network", arXiv:2307.08621 (scalar decay); Yang et al. (2024), "Gated Linear
Attention Transformers with Hardware-Efficient Training", arXiv:2312.06635 (vector gate). Gates are given in log
space, g_t <= 0, alpha_t = exp(g_t); the gate is a scalar per head and step (g: (B, H, T)) or one per key
dimension (g: (B, H, T, K)):

    S_t = diag(alpha_t) S_{t-1} + beta_t * k_t v_t^T      (scalar gate: alpha_t S_{t-1})
    o_t = S_t^T q_t                                        (prequential: o_t = S_{t-1}^T q_t, before the decay)

Chunked form, with b = cumsum(g) inside the chunk (never exp(+cumsum) factors, which overflow):

    A_ij = sum_d Q_id K_jd exp(b_id - b_jd)  for j <= i, else 0
    O_c  = (Q * exp(b)) S + A V
    S   <- diag(exp(b_C)) S + (K * exp(b_C - b))^T V
"""

import torch
from torch import Tensor

from cl_lightning.ops.utils import causal_mask, chunk_scan, decay_matrix, masked_read_write, recurrent_scan, start_state


def naive_recurrent_decay_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor | None = None,
    initial_state: Tensor | None = None,
    prequential: bool = False,
) -> tuple[Tensor, Tensor]:
    """Decay linear attention, token-by-token reference: S_t = diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T.

    Args:
        q, k, v, beta, initial_state, prequential: As for linear attention, the rule with g = 0
            (:func:`~cl_lightning.ops.linear_attn.naive_recurrent_linear_attn`).
        g: Log-space gates g_t <= 0, shape (B, H, T) (scalar gate) or (B, H, T, K) (vector gate, GLA); None means
            no decay (linear attention runs this code with it).
    """
    state = start_state(q, v, initial_state)
    if beta is not None:
        v = v * beta.unsqueeze(-1)
    alpha = None if g is None else (g if g.dim() == 4 else g.unsqueeze(-1)).exp()  # (B, H, T, K) or (B, H, T, 1)

    def write(t: int, state: Tensor) -> Tensor:  # one (decay and) write per token
        if alpha is not None:
            state = alpha[:, :, t, :, None] * state
        return state + k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, K, 1) * (B, H, 1, V)

    return recurrent_scan(write, q, state, prequential)


def chunk_decay_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor | None = None,
    initial_state: Tensor | None = None,
    prequential: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Decay linear attention, chunked form: S_t = diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T.

    As :func:`naive_recurrent_decay_linear_attn` (arguments, shapes, numbers); ``chunk_size`` C <= 64, any T.

    Example:
        >>> q, k, v = torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 3)
        >>> g = torch.nn.functional.logsigmoid(torch.randn(1, 2, 7, 4))  # vector gate
        >>> o, state = chunk_decay_linear_attn(q, k, v, g, chunk_size=4)
        >>> tuple(o.shape), tuple(state.shape)
        ((1, 2, 7, 3), (1, 2, 4, 3))
    """
    state = start_state(q, v, initial_state)
    if beta is not None:
        v = v * beta.unsqueeze(-1)
    gates = g.unsqueeze(-1) if g is not None and g.dim() == 3 else g  # (B, H, T, F), F = K or 1; None: no decay

    def step(q_c: Tensor, k_c: Tensor, v_c: Tensor, g_c: Tensor | None, state: Tensor) -> tuple[Tensor, Tensor]:
        if g_c is None:  # linear attention: O_c = Q S + Tril(Q K^T) V, S <- S + K^T V
            return masked_read_write(q_c, k_c, v_c, state, causal_mask(q_c.shape[2], prequential, q_c.device))
        b = g_c.cumsum(dim=2)  # (B, H, C, F)
        b_read = b - g_c if prequential else b  # prequential reads S_{t-1}: cumulative gate up to t-1
        if b.shape[-1] == 1:  # scalar gate: a (C, C) decay matrix suffices
            scores = (q_c @ k_c.transpose(-1, -2)) * decay_matrix(b_read[..., 0], b[..., 0], prequential)
        else:  # vector gate: (C, C, K) decay tensor
            decay = decay_matrix(b_read, b, prequential, feature_dims=1)  # (B, H, C, C, K)
            scores = torch.einsum("bhik,bhjk,bhijk->bhij", q_c, k_c, decay)
        o = (q_c * b_read.exp()) @ state + scores @ v_c
        b_last = b[:, :, -1:]  # (B, H, 1, F)
        state = b_last.transpose(-1, -2).exp() * state + (k_c * (b_last - b).exp()).transpose(-1, -2) @ v_c
        return o, state

    return chunk_scan(step, [q, k, v, gates], state, chunk_size)
