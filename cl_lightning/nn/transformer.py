"""The tiny in-context transformer of the full-attention baseline (Bekal et al. 2025, after Wang, Chandra & Zhang,
"Experience Replay Addresses Loss of Plasticity in Continual Learning", arXiv 2503.20018).

Every layer is single-head self-attention with a residual connection and nothing else:

    Z ← Z + softmax(Q Kᵀ / √d + M) V,    Q = Z W_q + b_q,  K = Z W_k + b_k,  V = Z W_v + b_v

no LayerNorm, no feed-forward block, no positional encoding, no causal mask, Xavier-initialised projections (the
authors' code). ``M`` is an optional mask (``-inf`` where attention is not allowed); :func:`support_mask` builds
the one that lets several queries share a sequence with their supports without seeing each other.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from cl_lightning.nn.mlp import init_linear


def support_mask(num_supports: int, num_tokens: int, device: torch.device | None = None) -> Tensor:
    """Boolean ``(N, N)`` mask, ``True`` where attention is allowed: every token sees the supports and itself.

    With tokens laid out as ``[supports (S), queries (N - S)]``, supports attend to supports only and each query to
    the supports and itself, so each query's output equals scoring it alone under the same mask.
    """
    cols = torch.arange(num_tokens, device=device)
    return (cols[None, :] < num_supports) | (cols[None, :] == cols[:, None])  # (N, N)


def naive_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Reference single-head attention ``softmax(q kᵀ / √D) v``: ``(B, N, D) x3, mask (N, N) bool -> (B, N, D)``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, N, N)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v  # (B, N, D)


class TinyTransformer(nn.Module):
    """A stack of single-head self-attention layers with residual connections only.

    Args:
        width: Token width ``d`` (PMNIST: 49 pixels + 10 label slots = 59).
        num_layers: Attention layers (paper: 10 on PMNIST, 3 on Split Tiny ImageNet; 1 on SCR, 2 in the code).
    """

    def __init__(self, width: int, num_layers: int) -> None:
        super().__init__()
        if width < 1 or num_layers < 1:
            raise ValueError(f"width and num_layers must be >= 1, got {width} and {num_layers}")
        self.width = width
        self.q = nn.ModuleList(nn.Linear(width, width) for _ in range(num_layers))
        self.k = nn.ModuleList(nn.Linear(width, width) for _ in range(num_layers))
        self.v = nn.ModuleList(nn.Linear(width, width) for _ in range(num_layers))
        for layer in [*self.q, *self.k, *self.v]:
            init_linear(layer, "xavier")

    def forward(self, tokens: Tensor, num_supports: int | None = None, fast: bool = True) -> Tensor:
        """``(B, N, D) -> (B, N, D)``.

        Args:
            tokens: Token sequences.
            num_supports: With a value ``S``, the first ``S`` tokens are supports and :func:`support_mask` applies;
                ``None``: full attention (the authors' code, one query per sequence).
            fast: Use SDPA (default) or the readable :func:`naive_attention` reference.
        """
        mask = None if num_supports is None else support_mask(num_supports, tokens.shape[-2], tokens.device)
        attend = nn.functional.scaled_dot_product_attention if fast else naive_attention
        z = tokens
        for q, k, v in zip(self.q, self.k, self.v, strict=True):
            z = z + attend(q(z), k(z), v(z), mask)  # residual only
        return z
