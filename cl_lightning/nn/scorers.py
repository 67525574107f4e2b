"""The query-only attention pair scorer Q_θ(x_t, x_j, y_j) (Bekal et al., arXiv 2510.00365, §2.3).

The authors' network is an MLP on the concatenation ``[x_j, x_t, onehot(y_j)]`` (108 → 100, 9 × (100 → 100),
100 → 1 on Permuted MNIST; Xavier-uniform weights, zero biases). Its first layer is linear, so on a pair it equals
``W_s x_j + W_q x_t + W_y[:, y_j] + b``: the support part is computed once per support, the query part once per
query, and the two are broadcast to all (query, support) pairs. Same numbers, about ``2D + C`` times less work in
the first layer and no (Q, S, 2D + C) tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cl_lightning.nn.mlp import InitName, init_linear


class PairScorer(nn.Module):
    """Scores every (query, support) pair; ``[x_j, x_t, onehot(y_j)]`` order as in the authors' code.

    Args:
        x_dim: Features of one example (49 on 7×7 Permuted MNIST).
        num_labels: Width of the label one-hot in the input (10); 0 for a label-free scorer (regression).
        hidden: Hidden width (100).
        num_hidden_layers: hidden → hidden layers after the first (9).
        init: Weight initialisation (paper: Xavier-uniform, zero biases).
        pair_budget: Pairs evaluated at once; queries go through in chunks so memory stays bounded.
    """

    def __init__(
        self,
        x_dim: int,
        num_labels: int,
        hidden: int = 100,
        num_hidden_layers: int = 9,
        init: InitName = "xavier",
        pair_budget: int = 1 << 16,
    ) -> None:
        super().__init__()
        self.x_dim, self.num_labels, self.pair_budget = x_dim, num_labels, pair_budget
        self.first = nn.Linear(2 * x_dim + num_labels, hidden)
        self.hidden = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(num_hidden_layers))
        self.out = nn.Linear(hidden, 1)
        for layer in (self.first, *self.hidden, self.out):
            init_linear(layer, init)

    def _tail(self, h: Tensor) -> Tensor:
        """Layers after the first pre-activation: ``(..., H) -> (...)``."""
        shape = h.shape[:-1]
        h = h.reshape(-1, h.shape[-1]).relu_()  # (N, H); in place: the pre-activation is not needed again
        for layer in self.hidden:  # modules called (not their weights) so forward hooks of monitors fire
            h = layer(h).relu_()
        return self.out(h).view(shape)

    def support_part(self, support_x: Tensor, support_y: Tensor | None) -> Tensor:
        """``W_s x_j + W_y[:, y_j]`` for every support: ``(S, D), (S,) -> (S, H)``."""
        w = self.first.weight  # (H, 2D + C)
        a = support_x @ w[:, : self.x_dim].T
        if self.num_labels:
            a = a + w[:, 2 * self.x_dim :].T[support_y]  # column y_j of W_y == W_y @ onehot(y_j)
        return a

    def query_part(self, query_x: Tensor) -> Tensor:
        """``W_q x_t + b`` for every query: ``(Q, D) -> (Q, H)``."""
        w = self.first.weight
        return torch.addmm(self.first.bias, query_x, w[:, self.x_dim : 2 * self.x_dim].T)

    def forward(self, query_x: Tensor, support_x: Tensor, support_y: Tensor | None = None) -> Tensor:
        """Raw scores of all pairs: ``(Q, D), (S, D), (S,) -> (Q, S)``, queries in chunks of ``pair_budget // S``."""
        a = self.support_part(support_x, support_y)  # (S, H)
        step = max(1, self.pair_budget // max(1, support_x.shape[0]))
        parts = [self._tail(self.query_part(q)[:, None, :] + a[None]) for q in query_x.split(step)]  # (q, S) each
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def forward_concat(self, query_x: Tensor, support_x: Tensor, support_y: Tensor | None = None) -> Tensor:
        """Reference: the authors' concatenated MLP on explicit ``[x_j, x_t, onehot(y_j)]`` pairs, ``-> (Q, S)``."""
        q, s = query_x.shape[0], support_x.shape[0]
        parts = [support_x[None].expand(q, s, -1), query_x[:, None].expand(q, s, -1)]  # (Q, S, D) each
        if self.num_labels:
            onehot = nn.functional.one_hot(support_y, self.num_labels).to(support_x.dtype)  # (S, C)
            parts.append(onehot[None].expand(q, s, -1))
        return self._tail(self.first(torch.cat(parts, dim=-1)))
