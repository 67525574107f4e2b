"""TTT-Linear: test-time training of a linear fast model with mini-batch gradient descent.

Sun et al. (2024), "Learning to (Learn at Test Time): RNNs with Expressive Hidden States", arXiv:2407.04620 (code:
ttt-lm-pytorch ``ttt.py``). The state is a linear model (W in R^{D x D}, b in R^D) per head; the inner model is
f(x) = x + LN(x W + b) with per-head LayerNorm weight gamma and bias beta_ln, and the inner loss is

    l_t(W, b) = 1/2 || LN(k_t W + b) - (v_t - k_t) ||^2

Mini-batches of size M: with (W_0, b_0) the state at the mini-batch start and token i (1-indexed) of the mini-batch,

    W_i = W_0 - tau_i sum_{j <= i} eta_j grad_W l_j(W_0, b_0)      (b_i likewise; every gradient is taken at W_0)
    o_i = q_i + LN(q_i W_i + b_i)                                  (prequential: read with W_{i-1}, b_{i-1})

eta_j is the per-token learning rate (the ``beta`` input; the paper uses (eta_base / D) sigmoid(theta^T x_j)),
tau_i the per-position scale (max(0, 1/i + offset_i) in the paper; 1/i by default). The next mini-batch starts from
W_M. Chunked (dual) form per mini-batch, with G = dl/dZ at Z = K W_0 + b_0 and E_ij = tau_i eta_j for j <= i:

    Z = Q W_0 + b_0 - Tril(E * (Q K^T + 1)) G ;   W_M = W_0 - K^T diag(E_M) G ;   b_M = b_0 - E_M G
"""

import torch
from torch import Tensor

from cl_lightning.ops.utils import check_mini_batch_size, chunk_scan, mini_batch_rates

TTTState = tuple[Tensor, Tensor]
LN_EPS = 1e-6  # eps of TTT's LayerNorm


def layer_norm(z: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """LayerNorm over the last dim (biased variance, eps 1e-6) with weight and bias broadcast against z."""
    mean = z.mean(dim=-1, keepdim=True)
    std = (z.var(dim=-1, unbiased=False, keepdim=True) + LN_EPS).sqrt()
    return weight * (z - mean) / std + bias


def ln_l2_grad(z: Tensor, target: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """dl/dz of l = 1/2 ||LN(z) - target||^2 in closed form (TTT's ``ln_fused_l2_bwd``): z, target ``(..., D)``, LN
    weight and bias broadcastable to them -> (D g - sum(g) - x_hat sum(g x_hat)) / (D sigma), g = (LN(z) - target) *
    weight, ``(..., D)``."""
    dim = z.shape[-1]
    mean = z.mean(dim=-1, keepdim=True)
    std = (z.var(dim=-1, unbiased=False, keepdim=True) + LN_EPS).sqrt()
    x_hat = (z - mean) / std
    g = (weight * x_hat + bias - target) * weight
    return (dim * g - g.sum(dim=-1, keepdim=True) - x_hat * (g * x_hat).sum(dim=-1, keepdim=True)) / (dim * std)


def _setup(
    q: Tensor, k: Tensor, v: Tensor, ln_weight: Tensor | None, ln_bias: Tensor | None, initial_state: TTTState | None
) -> tuple[Tensor, Tensor, TTTState]:
    """LN parameters shaped (H, 1, D) and the initial state (W (B, H, D, D), b (B, H, D)), zeros if None; K == V."""
    assert k.shape[-1] == v.shape[-1], "TTT-Linear needs K == V"
    batch, heads, _, dim = q.shape
    weight = q.new_ones(heads, dim) if ln_weight is None else ln_weight
    bias = q.new_zeros(heads, dim) if ln_bias is None else ln_bias
    if initial_state is None:
        initial_state = (q.new_zeros(batch, heads, dim, dim), q.new_zeros(batch, heads, dim))
    return weight.unsqueeze(1), bias.unsqueeze(1), initial_state


def _position_scale(q: Tensor, mini_batch_size: int, position_scale: Tensor | None) -> Tensor:
    """Position scales tau of shape (M,): ``position_scale`` or 1/i, i = 1..M."""
    check_mini_batch_size(mini_batch_size)
    if position_scale is not None:
        return position_scale
    return 1.0 / torch.arange(1, mini_batch_size + 1, dtype=q.dtype, device=q.device)


def ttt_linear_read(q: Tensor, weight: Tensor, bias: Tensor, ln_weight: Tensor, ln_bias: Tensor) -> Tensor:
    """TTT-Linear's read-out q + LN(q W + b): q (B, H, L, D), W (B, H, D, D), b (B, H, D), LN weights (H, 1, D)."""
    return q + layer_norm(q @ weight + bias.unsqueeze(2), ln_weight, ln_bias)


def naive_recurrent_ttt_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    ln_weight: Tensor | None = None,
    ln_bias: Tensor | None = None,
    initial_state: TTTState | None = None,
    prequential: bool = False,
    mini_batch_size: int = 16,
    position_scale: Tensor | None = None,
) -> tuple[Tensor, TTTState]:
    """TTT-Linear, token-by-token reference (primal form): W_i = W_0 - tau_i sum_{j<=i} eta_j grad l_j(W_0).

    Args:
        q, k, v: Queries, keys (the fast model's inputs) and values, shape (B, H, T, D); k_t's target is v_t - k_t.
        beta: Per-token learning rates eta_t >= 0, shape (B, H, T).
        ln_weight, ln_bias: LayerNorm weight and bias per head, shape (H, D); None means ones and zeros.
        initial_state: (W_0 (B, H, D, D), b_0 (B, H, D)), None meaning zeros; returned as the final (W, b) after the
            outputs o = q + LN(q W + b), (B, H, T, D).
        prequential: As for every matrix-state rule (:mod:`cl_lightning.ops`): read the state before token t's update.
        mini_batch_size: M, the tokens whose gradients are taken at the mini-batch's start state; each call starts a
            new mini-batch (calls match one call where they split the stream on mini-batch boundaries).
        position_scale: tau_i for i = 1..M, shape (M,); None means 1/i.
    """
    ln_w, ln_b, (weight, bias) = _setup(q, k, v, ln_weight, ln_bias, initial_state)
    tau = _position_scale(q, mini_batch_size, position_scale)
    outputs = []
    for t in range(q.shape[2]):  # sequential reference: gradients accumulate token by token within a mini-batch
        pos = t % mini_batch_size
        if pos == 0:  # a new mini-batch takes its gradients at its start state
            w_start, b_start, grad_w, grad_b = weight, bias, torch.zeros_like(weight), torch.zeros_like(bias)
        q_t, k_t, v_t = (x[:, :, t : t + 1] for x in (q, k, v))  # (B, H, 1, D)
        if prequential:
            outputs.append(ttt_linear_read(q_t, weight, bias, ln_w, ln_b))
        g_t = ln_l2_grad(k_t @ w_start + b_start.unsqueeze(2), v_t - k_t, ln_w, ln_b)  # dl_t/dz, (B, H, 1, D)
        lr = beta[:, :, t, None, None]  # (B, H, 1, 1)
        grad_w = grad_w + lr * k_t.transpose(-1, -2) @ g_t  # (B, H, D, D)
        grad_b = grad_b + lr[..., 0] * g_t[:, :, 0]  # (B, H, D)
        weight, bias = w_start - tau[pos] * grad_w, b_start - tau[pos] * grad_b
        if not prequential:
            outputs.append(ttt_linear_read(q_t, weight, bias, ln_w, ln_b))
    return torch.cat(outputs, dim=2), (weight, bias)


def chunk_ttt_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    ln_weight: Tensor | None = None,
    ln_bias: Tensor | None = None,
    initial_state: TTTState | None = None,
    prequential: bool = False,
    mini_batch_size: int = 16,
    position_scale: Tensor | None = None,
) -> tuple[Tensor, TTTState]:
    """TTT-Linear, chunked dual form: W_i = W_0 - tau_i sum_{j<=i} eta_j grad l_j(W_0), one chunk per mini-batch.

    As :func:`naive_recurrent_ttt_linear` (arguments, shapes, numbers).

    Example:
        >>> q, k, v = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
        >>> o, (weight, bias) = chunk_ttt_linear(q, k, v, torch.full((1, 2, 9), 0.1), mini_batch_size=4)
        >>> tuple(o.shape), tuple(weight.shape), tuple(bias.shape)
        ((1, 2, 9, 4), (1, 2, 4, 4), (1, 2, 4))
    """
    ln_w, ln_b, state = _setup(q, k, v, ln_weight, ln_bias, initial_state)
    tau = _position_scale(q, mini_batch_size, position_scale)

    def step(q_c: Tensor, k_c: Tensor, v_c: Tensor, beta_c: Tensor, state: TTTState) -> tuple[Tensor, TTTState]:
        weight, bias = state
        grad = ln_l2_grad(k_c @ weight + bias.unsqueeze(2), v_c - k_c, ln_w, ln_b)  # G at (W_0, b_0), (B, H, C, D)
        eta = mini_batch_rates(tau, beta_c, prequential)  # E_ij = tau_i eta_j, (B, H, C, C)
        z = q_c @ weight + bias.unsqueeze(2) - (eta * (q_c @ k_c.transpose(-1, -2) + 1.0)) @ grad  # (B, H, C, D)
        eta_grad = (tau[q_c.shape[2] - 1] * beta_c).unsqueeze(-1) * grad  # diag(E_M) G, (B, H, C, D)
        new_state = (weight - k_c.transpose(-1, -2) @ eta_grad, bias - eta_grad.sum(dim=2))
        return q_c + layer_norm(z, ln_w, ln_b), new_state

    return chunk_scan(step, [q, k, v, beta], state, mini_batch_size)
