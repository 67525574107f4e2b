"""Titans-style momentum ("surprise") on the fast-weight update, linear memory, with weight decay.

Behrouz, Zhong, Mirrokni (2025), "Titans: Learning to Memorize at Test Time", arXiv:2501.00663. The gradient of the
regression loss is the momentary surprise; a momentum state M accumulates it (past surprise) and the memory W forgets
with a retention gate. State convention W, M in R^{K x V}, readout o_t = W_t^T q_t:

    U_t = theta_t (v_t - W_0^T k_t)                     (minus the gradient of 1/2 ||W^T k - v||^2, taken at W_0)
    M_t = mu_t M_{t-1} + k_t U_t^T                      (mu_t = exp(log_momentum_t): momentum)
    W_t = r_t W_{t-1} + M_t                             (r_t = exp(log_retain_t) = 1 - alpha_t: weight decay)
    o_t = W_t^T q_t                                     (prequential: o_t = W_{t-1}^T q_t)

As in Titans' (and TTT's) parallel training, the gradients of a mini-batch of M tokens are all taken at W_0, the
memory at the mini-batch start; M = 1 gives exact per-token gradients (then mu = 0, r = 1 is the delta rule).
Chunked form per mini-batch, with b^r, b^mu the in-chunk cumulative log-gates, L^r_im = exp(b^r_i - b^r_m) (m <= i),
L^mu likewise and D = L^r L^mu:

    W_i = exp(b^r_i) W_0 + c_i M_0 + sum_{j<=i} D_ij k_j U_j^T,   c = L^r exp(b^mu)
    M_i = exp(b^mu_i) M_0 + sum_{j<=i} exp(b^mu_i - b^mu_j) k_j U_j^T
"""

import torch
from torch import Tensor

from cl_lightning.ops.utils import check_mini_batch_size, chunk_scan, decay_matrix, start_state

TitansState = tuple[Tensor, Tensor]


def _setup(q: Tensor, v: Tensor, beta: Tensor, log_momentum, log_retain, initial_state, mini_batch_size):
    check_mini_batch_size(mini_batch_size)
    log_momentum, log_retain = (torch.zeros_like(beta) if g is None else g for g in (log_momentum, log_retain))
    if initial_state is None:
        initial_state = (start_state(q, v, None),) * 2
    return log_momentum, log_retain, initial_state


def naive_recurrent_titans_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_momentum: Tensor | None = None,
    log_retain: Tensor | None = None,
    initial_state: TitansState | None = None,
    prequential: bool = False,
    mini_batch_size: int = 16,
) -> tuple[Tensor, TitansState]:
    """Momentum + weight-decay fast weights, token by token: M_t = mu_t M + k_t U_t^T, W_t = r_t W + M_t.

    Args:
        q, k, v, prequential: As for every matrix-state rule (:mod:`cl_lightning.ops`); L2-normalise the keys.
        beta: Surprise step sizes theta_t, shape (B, H, T).
        log_momentum: log mu_t <= 0, shape (B, H, T); None means mu = 1 (momentum never decays).
        log_retain: log r_t = log(1 - alpha_t) <= 0, shape (B, H, T); None means r = 1 (no weight decay).
        initial_state: (W_0, M_0), each (B, H, K, V), None meaning zeros; returned as the final (W, M) after the
            outputs (B, H, T, V).
        mini_batch_size: Tokens whose gradients are taken at the mini-batch's start memory (1: exact); each call
            starts a new mini-batch.
    """
    log_momentum, log_retain, (weight, momentum) = _setup(
        q, v, beta, log_momentum, log_retain, initial_state, mini_batch_size
    )
    start, outputs = weight, []
    for t in range(q.shape[2]):  # sequential reference: two coupled recurrences, gradients at the mini-batch start
        if t % mini_batch_size == 0:
            start = weight
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]
        if prequential:
            outputs.append(torch.einsum("bhk,bhkv->bhv", q_t, weight))
        surprise = beta[:, :, t, None] * (v_t - torch.einsum("bhk,bhkv->bhv", k_t, start))  # (B, H, V)
        momentum = log_momentum[:, :, t, None, None].exp() * momentum + k_t.unsqueeze(-1) * surprise.unsqueeze(-2)
        weight = log_retain[:, :, t, None, None].exp() * weight + momentum
        if not prequential:
            outputs.append(torch.einsum("bhk,bhkv->bhv", q_t, weight))
    return torch.stack(outputs, dim=2), (weight, momentum)


def chunk_titans_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_momentum: Tensor | None = None,
    log_retain: Tensor | None = None,
    initial_state: TitansState | None = None,
    prequential: bool = False,
    mini_batch_size: int = 16,
) -> tuple[Tensor, TitansState]:
    """Momentum + weight-decay fast weights, chunked closed form (one chunk per mini-batch).

    As :func:`naive_recurrent_titans_linear` (arguments, shapes, numbers).

    Example:
        >>> q, k, v = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 3)
        >>> o, (w, m) = chunk_titans_linear(q, k, v, torch.full((1, 2, 9), 0.1), mini_batch_size=4)
        >>> tuple(o.shape), tuple(w.shape), tuple(m.shape)
        ((1, 2, 9, 3), (1, 2, 4, 3), (1, 2, 4, 3))
    """
    log_momentum, log_retain, state = _setup(q, v, beta, log_momentum, log_retain, initial_state, mini_batch_size)

    def step(q_c, k_c, v_c, beta_c, lm_c, lr_c, state: TitansState) -> tuple[Tensor, TitansState]:
        weight, momentum = state
        b_mu, b_r = lm_c.cumsum(-1), lr_c.cumsum(-1)  # (B, H, C)
        l_r, l_mu = decay_matrix(b_r, b_r, strict=False), decay_matrix(b_mu, b_mu, strict=False)  # (B, H, C, C)
        mix = l_r @ l_mu  # D_ij = sum_{j <= m <= i} exp(b^r_i - b^r_m + b^mu_m - b^mu_j)
        carry = (l_r @ b_mu.exp().unsqueeze(-1)).squeeze(-1)  # c_i, weight of M_0 in W_i, (B, H, C)
        surprise = beta_c.unsqueeze(-1) * (v_c - k_c @ weight)  # U, (B, H, C, V)
        keep = b_r.exp()
        if prequential:  # read W_{i-1}: shift every coefficient down one row (W_{-1} = W_0)
            keep = torch.cat([torch.ones_like(keep[..., :1]), keep[..., :-1]], dim=-1)
            carry = torch.cat([torch.zeros_like(carry[..., :1]), carry[..., :-1]], dim=-1)
            mix = torch.cat([torch.zeros_like(mix[..., :1, :]), mix[..., :-1, :]], dim=-2)
        scores = (q_c @ k_c.transpose(-1, -2)) * mix
        out = keep.unsqueeze(-1) * (q_c @ weight) + carry.unsqueeze(-1) * (q_c @ momentum) + scores @ surprise
        last_mix = (l_r[..., -1, :].unsqueeze(-2) @ l_mu).squeeze(-2)  # D_{C, j}, (B, H, C)
        new_weight = (
            b_r[..., -1, None, None].exp() * weight
            + (l_r[..., -1, :] * b_mu.exp()).sum(-1)[..., None, None] * momentum
            + k_c.transpose(-1, -2) @ (last_mix.unsqueeze(-1) * surprise)
        )
        decay_j = (b_mu[..., -1:] - b_mu).exp().unsqueeze(-1)  # exp(b^mu_C - b^mu_j), (B, H, C, 1)
        new_momentum = b_mu[..., -1, None, None].exp() * momentum + k_c.transpose(-1, -2) @ (decay_j * surprise)
        return out, (new_weight, new_momentum)

    return chunk_scan(step, [q, k, v, beta, log_momentum, log_retain], state, mini_batch_size)
