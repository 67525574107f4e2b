"""Deep memory: a two-layer MLP fast weight trained by mini-batch gradient descent on its regression loss.

The TTT-MLP idea (Sun et al. 2024, "Learning to (Learn at Test Time): RNNs with Expressive Hidden States",
arXiv:2407.04620), without TTT's LayerNorm and residual so that values may have any width V. Per head the state is
the fast model

    f(x) = gelu(x W1 + b1) W2 + b2       W1 in R^{K x D_h}, b1 in R^{D_h}, W2 in R^{D_h x V}, b2 in R^V

(tanh-approximated GELU) and the inner loss is l_t = 1/2 ||f(k_t) - v_t||^2. Mini-batches of M tokens take every
gradient at the mini-batch start parameters P_0: for token i (1-indexed) of a mini-batch,

    P_i = P_0 - tau_i sum_{j <= i} eta_j grad l_j(P_0)       o_i = f(q_i; P_i)   (prequential: f(q_i; P_{i-1}))

eta_j is the per-token rate (the ``beta`` input), tau_i a per-position scale (ones by default: plain mini-batch GD;
TTT's 1/i via ``position_scale``). Dual (chunked) form, with Z1 = K W1 + b1, X2 = gelu(Z1), G2 = X2 W2 + b2 - V,
G1 = (G2 W2^T) * gelu'(Z1) all at P_0 and E_ij = tau_i eta_j (j <= i), applied layer by layer:

    Zq = Q W1 + b1 - (E * (Q K^T + 1)) G1 ;  Xq = gelu(Zq) ;  O = Xq W2 + b2 - (E * (Xq X2^T + 1)) G2
"""

import math

import torch
from torch import Tensor

from cl_lightning.ops.utils import check_mini_batch_size, chunk_scan, mini_batch_rates

MLPState = tuple[Tensor, Tensor, Tensor, Tensor]
_C = math.sqrt(2.0 / math.pi)


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh approximation: 1/2 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * x.pow(3))))


def gelu_grad(x: Tensor) -> Tensor:
    """Derivative of :func:`gelu` (twice differentiable, so the inner step can be trained through)."""
    th = torch.tanh(_C * (x + 0.044715 * x.pow(3)))
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th.pow(2)) * _C * (1.0 + 3 * 0.044715 * x.pow(2))


def _grads(k: Tensor, v: Tensor, state: MLPState) -> tuple[Tensor, Tensor, Tensor]:
    """(X2, G1, G2) at the parameters ``state`` for keys (B, H, L, K) and values (B, H, L, V)."""
    w1, b1, w2, b2 = state
    z1 = k @ w1 + b1.unsqueeze(2)
    x2 = gelu(z1)
    g2 = x2 @ w2 + b2.unsqueeze(2) - v  # dl/dZ2
    g1 = (g2 @ w2.transpose(-1, -2)) * gelu_grad(z1)  # dl/dZ1
    return x2, g1, g2


def mlp_forward(x: Tensor, state: MLPState) -> Tensor:
    """f(x) = gelu(x W1 + b1) W2 + b2 for x of shape (B, H, L, K)."""
    w1, b1, w2, b2 = state
    return gelu(x @ w1 + b1.unsqueeze(2)) @ w2 + b2.unsqueeze(2)


def _setup(q: Tensor, mini_batch_size: int, position_scale: Tensor | None) -> Tensor:
    check_mini_batch_size(mini_batch_size)
    return q.new_ones(mini_batch_size) if position_scale is None else position_scale


def naive_recurrent_ttt_mlp(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    initial_state: MLPState,
    prequential: bool = False,
    mini_batch_size: int = 16,
    position_scale: Tensor | None = None,
) -> tuple[Tensor, MLPState]:
    """Two-layer MLP fast weight, token-by-token primal form: P_i = P_0 - tau_i sum_{j<=i} eta_j grad l_j(P_0).

    Args:
        q, k, v: Queries and keys (B, H, T, K), values (the regression targets) (B, H, T, V).
        beta: Per-token rates eta_t >= 0, shape (B, H, T).
        initial_state: (W1 (B, H, K, D_h), b1 (B, H, D_h), W2 (B, H, D_h, V), b2 (B, H, V)), W1 not zero (a zero W1
            and W2 has zero gradient), e.g. N(0, 1/K); returned as the final state after the outputs (B, H, T, V).
        prequential: If True, o_t = f(q_t; P_{t-1}); otherwise f(q_t; P_t).
        mini_batch_size: Mini-batch size M; each call starts a new mini-batch.
        position_scale: tau_i for i = 1..M, shape (M,); None means ones.
    """
    tau = _setup(q, mini_batch_size, position_scale)
    state, start, acc, outputs = initial_state, initial_state, None, []
    for t in range(q.shape[2]):  # sequential reference: accumulate gradients taken at the mini-batch start
        pos = t % mini_batch_size
        if pos == 0:
            start, acc = state, [torch.zeros_like(p) for p in state]
        q_t, k_t, v_t = (x[:, :, t : t + 1] for x in (q, k, v))
        if prequential:
            outputs.append(mlp_forward(q_t, state))
        x2, g1, g2 = _grads(k_t, v_t, start)
        lr = beta[:, :, t, None, None]  # (B, H, 1, 1)
        step = (k_t.transpose(-1, -2) @ g1, g1[:, :, 0], x2.transpose(-1, -2) @ g2, g2[:, :, 0])
        acc = [a + (lr if s.dim() == 4 else lr[..., 0]) * s for a, s in zip(acc, step, strict=True)]
        state = tuple(p - tau[pos] * a for p, a in zip(start, acc, strict=True))
        if not prequential:
            outputs.append(mlp_forward(q_t, state))
    return torch.cat(outputs, dim=2), state


def chunk_ttt_mlp(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    initial_state: MLPState,
    prequential: bool = False,
    mini_batch_size: int = 16,
    position_scale: Tensor | None = None,
) -> tuple[Tensor, MLPState]:
    """Two-layer MLP fast weight, chunked dual form (one chunk per mini-batch).

    As :func:`naive_recurrent_ttt_mlp` (arguments, shapes, numbers).

    Example:
        >>> q, k, v = torch.randn(1, 1, 9, 4), torch.randn(1, 1, 9, 4), torch.randn(1, 1, 9, 3)
        >>> state = (torch.randn(1, 1, 4, 8) / 2, torch.zeros(1, 1, 8), torch.zeros(1, 1, 8, 3), torch.zeros(1, 1, 3))
        >>> o, (w1, b1, w2, b2) = chunk_ttt_mlp(q, k, v, torch.full((1, 1, 9), 0.1), state, mini_batch_size=4)
        >>> tuple(o.shape), tuple(w2.shape)
        ((1, 1, 9, 3), (1, 1, 8, 3))
    """
    tau = _setup(q, mini_batch_size, position_scale)

    def step(q_c: Tensor, k_c: Tensor, v_c: Tensor, beta_c: Tensor, state: MLPState) -> tuple[Tensor, MLPState]:
        w1, b1, w2, b2 = state
        x2, g1, g2 = _grads(k_c, v_c, state)
        eta = mini_batch_rates(tau, beta_c, prequential)  # E_ij = tau_i eta_j, (B, H, C, C)
        zq = q_c @ w1 + b1.unsqueeze(2) - (eta * (q_c @ k_c.transpose(-1, -2) + 1.0)) @ g1
        xq = gelu(zq)
        out = xq @ w2 + b2.unsqueeze(2) - (eta * (xq @ x2.transpose(-1, -2) + 1.0)) @ g2
        last = (tau[q_c.shape[2] - 1] * beta_c).unsqueeze(-1)  # diag(E_M), (B, H, C, 1)
        new_state = (
            w1 - k_c.transpose(-1, -2) @ (last * g1),
            b1 - (last * g1).sum(2),
            w2 - x2.transpose(-1, -2) @ (last * g2),
            b2 - (last * g2).sum(2),
        )
        return out, new_state

    return chunk_scan(step, [q, k, v, beta], initial_state, mini_batch_size)
