"""Omega rule (Behrouz et al. 2025, "ATLAS: Learning to Optimally Memorize the Context at Test Time",
arXiv:2505.23735): one gradient step per token on the loss over a sliding window of the last c tokens, not the newest
token only. Linear memory, state convention S in R^{K x V}, readout o_t = S_t^T q_t:

    S_t = S_{t-1} + eta_t sum_{i = t-c+1}^{t} gamma_i k_i (v_i - S_{t-1}^T k_i)^T
    o_t = S_t^T q_t                                        (prequential: o_t = S_{t-1}^T q_t)

eta_t is the step size (the ``beta`` input), gamma_i the importance of token i inside every window it belongs to
(ones if None). With c = 1 this is the delta rule with learning rate eta_t gamma_t. Every step's gradient is taken at
S_{t-1} (exact per-token updates, no gradient lag), so the chunked form equals the recurrence.

Chunked form: step t writes the c window pairs (K_t, V_t) in one mini-batch, so with A_t = diag(eta_t gamma_window)
and U_t = A_t (V_t - K_t S_{t-1}), S_t = S_0 + sum_{s<=t} K_s^T U_s. Stacking the C steps of a chunk into C*c rows
(K_b, V_b, a_b) gives a block unit-lower-triangular system (the delta rule's WY/UT form with rank-c steps):

    L = I + BlockStrictTril(diag(a_b) K_b K_b^T) ;   L [W | U] = [diag(a_b) K_b | diag(a_b) V_b]
    U' = U - W S ;   O = Q S + BlockTril(Q K_b^T) U' ;   S <- S + K_b^T U'

The window starts at each call: the first c - 1 tokens of a call see a shorter window (tokens before the call are
not kept), as a TTT mini-batch starts at each call.
"""

import torch
from torch import Tensor

from cl_lightning.ops.utils import chunk_scan, masked_read_write, recurrent_scan, start_state, unit_lower_solve


def _setup(q: Tensor, v: Tensor, beta: Tensor, gamma: Tensor | None, window: int, initial_state: Tensor | None):
    """gamma (ones if None) and S_0, the window checked."""
    if window < 1:
        raise ValueError(f"window (the Omega rule's c) must be >= 1, got {window}")
    return torch.ones_like(beta) if gamma is None else gamma, start_state(q, v, initial_state)


def naive_recurrent_omega_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    gamma: Tensor | None = None,
    window: int = 4,
    initial_state: Tensor | None = None,
    prequential: bool = False,
) -> tuple[Tensor, Tensor]:
    """Omega rule, token-by-token reference: S_t = S_{t-1} + eta_t sum_{window} gamma_i k_i (v_i - S_{t-1}^T k_i)^T.

    Args:
        q, v, initial_state, prequential: As for every matrix-state rule (:mod:`cl_lightning.ops`, also the returns).
        k: Keys, shape (B, H, T, K); L2-normalise them, and keep eta * sum(gamma) below 2, for a stable write.
        beta: Step sizes eta_t, shape (B, H, T).
        gamma: Per-token importance gamma_i inside the windows, shape (B, H, T); None means ones.
        window: Window length c >= 1 (c = 1 is the delta rule).
    """
    gamma, state = _setup(q, v, beta, gamma, window, initial_state)

    def write(t: int, state: Tensor) -> Tensor:  # one gradient step on the window loss per token
        lo = max(0, t - window + 1)
        k_w, v_w = k[:, :, lo : t + 1], v[:, :, lo : t + 1]  # (B, H, c', K), (B, H, c', V)
        rate = beta[:, :, t, None] * gamma[:, :, lo : t + 1]  # (B, H, c')
        error = (v_w - k_w @ state) * rate.unsqueeze(-1)  # (B, H, c', V)
        return state + k_w.transpose(-1, -2) @ error

    return recurrent_scan(write, q, state, prequential)


def _windows(x: Tensor, window: int) -> Tensor:
    """(B, H, T, *F) -> (B, H, T, c, *F): entry [t, i] is x[t - c + 1 + i], zero before the sequence start."""
    pad = x.new_zeros(*x.shape[:2], window - 1, *x.shape[3:])
    padded = torch.cat([pad, x], dim=2)
    out = padded.unfold(2, window, 1)  # (B, H, T, *F, c)
    return out.movedim(-1, 3) if x.dim() > 3 else out


def chunk_omega_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    gamma: Tensor | None = None,
    window: int = 4,
    initial_state: Tensor | None = None,
    prequential: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Omega rule, chunked block-WY form: S_t = S_{t-1} + eta_t sum_{window} gamma_i k_i (v_i - S_{t-1}^T k_i)^T.

    As :func:`naive_recurrent_omega_rule` (arguments, shapes, numbers); ``chunk_size`` C (the solve has C * c rows).

    Example:
        >>> from cl_lightning.ops.delta_rule import chunk_delta_rule
        >>> q, k, v = torch.randn(1, 1, 7, 4), torch.randn(1, 1, 7, 4), torch.randn(1, 1, 7, 3)
        >>> beta = torch.full((1, 1, 7), 0.1)
        >>> o, s = chunk_omega_rule(q, k, v, beta, window=1, chunk_size=3)
        >>> torch.allclose(o, chunk_delta_rule(q, k, v, beta, chunk_size=3)[0], atol=1e-6)  # c = 1: delta rule
        True
    """
    gamma, state = _setup(q, v, beta, gamma, window, initial_state)
    k_w, v_w = _windows(k, window), _windows(v, window)  # (B, H, T, c, K), (B, H, T, c, V)
    rate = beta.unsqueeze(-1) * _windows(gamma, window)  # a_{t,i} = eta_t gamma_i, 0 before the start, (B, H, T, c)

    def step(q_c: Tensor, k_c: Tensor, v_c: Tensor, a_c: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        size = q_c.shape[2]
        k_b, v_b = k_c.flatten(2, 3), v_c.flatten(2, 3)  # (B, H, C*c, K), (B, H, C*c, V)
        a_b = a_c.flatten(2, 3).unsqueeze(-1)  # (B, H, C*c, 1)
        block = torch.arange(size * window, device=q_c.device) // window  # the step each stacked row belongs to
        lower = ((a_b * k_b) @ k_b.transpose(-1, -2)).masked_fill(~(block[:, None] > block[None, :]), 0.0)
        w, u = unit_lower_solve(lower, a_b * k_b, a_b * v_b)
        u = u - w @ state  # U' = U - W S
        steps = torch.arange(size, device=q_c.device)
        read = block[None, :] < steps[:, None] if prequential else block[None, :] <= steps[:, None]  # (C, C*c)
        return masked_read_write(q_c, k_b, u, state, read)

    return chunk_scan(step, [q, k_w, v_w, rate], state, chunk_size)
