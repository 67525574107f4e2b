"""Longhorn: a state-space model as an amortised implicit (proximal) online learner.

Liu et al. (2024), "Longhorn: State Space Models are Amortized Online Learners", arXiv:2407.14207. For each value
channel c the exact step solves argmin_s ||s - s_{t-1,c}||^2 + beta_{t,c} (s^T k_t - v_{t,c})^2, i.e.

    s_{t,c} = (I - eps_{t,c} k_t k_t^T) s_{t-1,c} + eps_{t,c} v_{t,c} k_t,   eps = beta / (1 + beta ||k_t||^2)

This module implements the form of the reference code (``Longhorn.step``): the diagonal approximation of
I - eps k k^T, a selective scan over a K x V state (K = d_state, V = channels):

    S_t[i, c] = (1 - eps_{t,c} k_{t,i}^2) S_{t-1}[i, c] + eps_{t,c} k_{t,i} v_{t,c}
    o_t = S_t^T q_t                                        (prequential: o_t = S_{t-1}^T q_t)

Keys are not normalised (eps normalises the step; every transition stays in (0, 1]). The skip term D v and the
output gate of the layer are left to the caller. The exact (non-diagonal) step with one beta per head is
``chunk_delta_rule(q, k, v, longhorn_step_size(beta, k))``. Chunked form: log-space cumulative transitions
b = cumsum(log(1 - eps k^2)) per (key, channel) pair inside the chunk, the GLA algebra with a (K, V) gate.
"""

import torch
from torch import Tensor

from cl_lightning.ops.utils import chunk_scan, decay_matrix, recurrent_scan, start_state


def longhorn_step_size(beta: Tensor, k: Tensor) -> Tensor:
    """Longhorn's normalised step eps = beta / (1 + beta ||k||^2): beta > 0 (B, H, T) or (B, H, T, V), k (B, H, T, K)
    -> eps shaped as beta.

    Example:
        >>> longhorn_step_size(torch.tensor([[[1.0]]]), torch.tensor([[[[1.0, 1.0]]]]))
        tensor([[[0.3333]]])
    """
    sq_norm = k.pow(2).sum(dim=-1)  # (B, H, T)
    if beta.dim() == 4:
        sq_norm = sq_norm.unsqueeze(-1)  # (B, H, T, 1)
    return beta / (1.0 + beta * sq_norm)


def _channel_step_size(beta: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Step sizes eps of shape (B, H, T, V) from beta of shape (B, H, T) or (B, H, T, V)."""
    eps = longhorn_step_size(beta, k)
    return eps.unsqueeze(-1).expand_as(v) if eps.dim() == 3 else eps


def naive_recurrent_longhorn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    prequential: bool = False,
) -> tuple[Tensor, Tensor]:
    """Longhorn, token-by-token reference: S_t = (1 - eps_t k_t^2) * S_{t-1} + eps_t k_t v_t^T (diagonal).

    Args:
        q, initial_state, prequential: As for every matrix-state rule (:mod:`cl_lightning.ops`, also the returns).
        k: Keys, shape (B, H, T, K); not normalised (the step size eps = beta / (1 + beta ||k||^2) is).
        v: Values (the channels x_t), shape (B, H, T, V).
        beta: Step sizes beta_t > 0, shape (B, H, T) (per head) or (B, H, T, V) (per channel, as in the paper's code).
    """
    state = start_state(q, v, initial_state)
    eps = _channel_step_size(beta, k, v)  # (B, H, T, V)

    def write(t: int, state: Tensor) -> Tensor:  # one diagonal proximal step per token
        k_t, eps_t = k[:, :, t, :, None], eps[:, :, t, None, :]  # (B, H, K, 1), (B, H, 1, V)
        return (1.0 - eps_t * k_t.pow(2)) * state + k_t * (eps_t * v[:, :, t, None, :])  # (B, H, K, V)

    return recurrent_scan(write, q, state, prequential)


def chunk_longhorn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    prequential: bool = False,
    chunk_size: int = 16,
) -> tuple[Tensor, Tensor]:
    """Longhorn, chunked selective scan: S_t = (1 - eps_t k_t^2) * S_{t-1} + eps_t k_t v_t^T (diagonal).

    As :func:`naive_recurrent_longhorn` (arguments, shapes, numbers); ``chunk_size`` C small (a chunk's decay
    tensor is (C, C, K, V) per head).

    Example:
        >>> q, k, v = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 3)
        >>> o, state = chunk_longhorn(q, k, v, torch.rand(1, 2, 9, 3), chunk_size=4)
        >>> tuple(o.shape), tuple(state.shape)
        ((1, 2, 9, 3), (1, 2, 4, 3))
    """
    state = start_state(q, v, initial_state)
    eps = _channel_step_size(beta, k, v)  # (B, H, T, V)

    def step(q_c: Tensor, k_c: Tensor, v_c: Tensor, eps_c: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        log_gate = torch.log1p(-k_c.pow(2).unsqueeze(-1) * eps_c.unsqueeze(-2))  # (B, H, C, K, V), values <= 0
        b = log_gate.cumsum(dim=2)
        b_read = b - log_gate if prequential else b  # prequential reads S_{t-1}
        write = eps_c * v_c  # (B, H, C, V)
        decay = decay_matrix(b_read, b, prequential, feature_dims=2)  # (B, H, C, C, K, V)
        o = torch.einsum("bhik,bhikv,bhkv->bhiv", q_c, b_read.exp(), state)
        o = o + torch.einsum("bhik,bhijkv,bhjk,bhjv->bhiv", q_c, decay, k_c, write)
        b_last = b[:, :, -1]  # (B, H, K, V)
        inputs = torch.einsum("bhjk,bhjv,bhjkv->bhkv", k_c, write, (b_last.unsqueeze(2) - b).exp())
        return o, b_last.exp() * state + inputs

    return chunk_scan(step, [q, k, v, eps], state, chunk_size)
