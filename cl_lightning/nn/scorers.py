"""The query-only attention pair scorer Q_θ(x_t, x_j, y_j) (Bekal et al., arXiv 2510.00365; docs/qoa.md §3).

The authors' network is an MLP on ``[x_j, x_t, onehot(y_j)]`` (Xavier-uniform weights, zero biases). Its first layer
is linear, so on a pair it equals ``W_s x_j + W_q x_t + W_y[:, y_j] + b``: the support part is computed once per
support, the query part once per query, and the two are broadcast to all (query, support) pairs (the same numbers,
no (Q, S, 2D + C) tensor). Evaluation, almost all of a task's arithmetic, runs in cache-sized blocks of pairs
(:meth:`PairScorer.score_blocked`).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from cl_lightning.nn.fused_steps import has_forward_hooks
from cl_lightning.nn.mlp import init_linear

#: Measured block sizes (pairs per block) by (device type, threads, hidden, layers, dtype): see tuned_block_pairs.
_BLOCK_CACHE: dict[tuple, int] = {}
_CPU_CANDIDATES = (1024, 2048, 4096, 8192, 16384)
_CUDA_CANDIDATES = (1 << 16, 1 << 18, 1 << 20, 1 << 21)


def tuned_block_pairs(hidden: int, num_layers: int, device: torch.device, dtype: torch.dtype) -> int:
    """Pairs per evaluation block that run fastest here, measured once per process (and thread count) and cached.

    Each candidate runs :meth:`PairScorer.score_blocked`'s layer loop on random data; the fastest per pair wins
    (best of three; on CPU in process CPU time, which a busy shared machine disturbs far less than wall time).
    """
    key = (device.type, torch.get_num_threads(), hidden, num_layers, dtype)
    if key in _BLOCK_CACHE:
        return _BLOCK_CACHE[key]
    candidates = _CUDA_CANDIDATES if device.type == "cuda" else _CPU_CANDIDATES
    gen = torch.Generator(device="cpu").manual_seed(0)
    weights = [(torch.randn(hidden, hidden, generator=gen) / hidden**0.5).to(device, dtype) for _ in range(num_layers)]
    bias = torch.zeros(hidden, device=device, dtype=dtype)
    best, best_per_pair = candidates[0], float("inf")
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    work = candidates[-1] // 2  # pairs timed per candidate and repeat (the largest candidate runs once)
    for n in candidates:
        h = torch.randn(n, hidden, generator=gen).to(device, dtype)
        g = torch.empty_like(h)
        per_pair = float("inf")
        for _ in range(3):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = clock()
            reps = max(1, work // n)
            for _ in range(reps):
                for w in weights:
                    torch.addmm(bias, h, w.T, out=g).relu_()
                    h, g = g, h
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            per_pair = min(per_pair, (clock() - start) / (reps * n))
        if per_pair < best_per_pair:  # no division: a clock that reads 0 cannot raise
            best, best_per_pair = n, per_pair
    _BLOCK_CACHE[key] = best
    return best


class PairScorer(nn.Module):
    """Scores every (query, support) pair; ``[x_j, x_t, onehot(y_j)]`` order as in the authors' code.

    Args:
        x_dim: Features of one example (49 on 7×7 Permuted MNIST).
        num_labels: Width of the label one-hot in the input (10); 0 for a label-free scorer (regression).
        hidden: Hidden width (100).
        num_hidden_layers: hidden → hidden layers after the first (9).
        block_pairs: Pairs per block of the no-gradient evaluation path; ``None`` measures it on first use
            (:func:`tuned_block_pairs`).
        eval_dtype_cpu: Evaluate in :attr:`eval_dtype` on CPU too (tests of the reduced-precision path).
    """

    pair_budget = 1 << 16  # pairs at once on the gradient (and hooked evaluation) path: queries go in chunks
    eval_dtype = torch.bfloat16  # the evaluation path's arithmetic on CUDA (scores come back in the input dtype)

    def __init__(
        self,
        x_dim: int,
        num_labels: int,
        hidden: int = 100,
        num_hidden_layers: int = 9,
        block_pairs: int | None = None,
        eval_dtype_cpu: bool = False,
    ) -> None:
        super().__init__()
        self.x_dim, self.num_labels = x_dim, num_labels
        self.block_pairs, self.eval_dtype_cpu = block_pairs, eval_dtype_cpu
        self.first = nn.Linear(2 * x_dim + num_labels, hidden)
        self.hidden = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(num_hidden_layers))
        self.out = nn.Linear(hidden, 1)
        for layer in (self.first, *self.hidden, self.out):
            init_linear(layer, "xavier")
        self._workspace: tuple[Tensor, Tensor] | None = None  # evaluation ping-pong buffers, kept between calls

    def tail(self, h: Tensor) -> Tensor:
        """Layers after the first pre-activation: ``(..., H) -> (...)`` (ReLU, then the hidden layers and the output
        layer as modules, so forward hooks fire)."""
        shape = h.shape[:-1]
        # out of place: ``h`` is a view of the broadcast sum, and an in-place ReLU on a view makes autograd copy the
        # whole sum's gradient twice (CopySlices) in the backward pass; the same values either way
        h = h.reshape(-1, h.shape[-1]).relu()  # (N, H)
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
        """Raw scores of all pairs: ``(Q, D), (S, D), (S,) -> (Q, S)``.

        Without gradients (evaluation, online metric) and without forward hooks on the layers this is
        :meth:`score_blocked`; otherwise queries go in chunks of ``pair_budget // S`` through the modules.
        """
        needs_grad = torch.is_grad_enabled() and (
            query_x.requires_grad or support_x.requires_grad or any(p.requires_grad for p in self.parameters())
        )
        if not needs_grad and not has_forward_hooks((self.first, *self.hidden, self.out)):
            return self.score_blocked(query_x, support_x, support_y)
        a = self.support_part(support_x, support_y)  # (S, H)
        budget = self.pair_budget
        if not needs_grad:  # hooked evaluation (a monitor watches the layers): cache-sized blocks as score_blocked
            budget = self.block_pairs or tuned_block_pairs(a.shape[1], len(self.hidden), a.device, a.dtype)
        step = max(1, budget // max(1, support_x.shape[0]))
        if has_forward_hooks((self.first,)):  # a monitor watches the first layer: its hooks see explicit pairs (slower)
            parts = [self.forward_concat(q, support_x, support_y) for q in query_x.split(step)]
        else:
            parts = [self.tail(self.query_part(q)[:, None, :] + a[None]) for q in query_x.split(step)]  # (q, S) each
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    @torch.no_grad()
    def score_blocked(self, query_x: Tensor, support_x: Tensor, support_y: Tensor | None = None) -> Tensor:
        """The evaluation path, :meth:`forward_concat`'s scores: ``(Q, D), (S, D), (S,) -> (Q, S)``.

        Whole queries go through the layers after the factorised first one in blocks of ``block_pairs`` pairs, in
        two ping-pong buffers kept between calls: per layer one ``addmm`` (bias included) and one in-place ReLU.
        Autocast is off: on CUDA the arithmetic is in :attr:`eval_dtype` explicitly.
        """
        with torch.autocast(query_x.device.type, enabled=False):
            device, out_dtype = query_x.device, query_x.dtype
            dtype = self.eval_dtype if device.type == "cuda" or self.eval_dtype_cpu else out_dtype
            a = self.support_part(support_x, support_y).to(dtype)  # (S, H)
            b = self.query_part(query_x).to(dtype)  # (Q, H)
            n_q, n_s, width = b.shape[0], a.shape[0], a.shape[1]
            scores = torch.empty(n_q, n_s, device=device, dtype=dtype)
            if n_q == 0 or n_s == 0:
                return scores.to(out_dtype)
            block = self.block_pairs or tuned_block_pairs(width, len(self.hidden), device, dtype)
            step = max(1, min(n_q, block // n_s))
            h_all, g_all = self._buffers_for(step * n_s, width, device, dtype)
            layers = [(m.weight.to(dtype).T, m.bias.to(dtype)) for m in self.hidden]
            w_out, b_out = self.out.weight.to(dtype).T, self.out.bias.to(dtype)  # (H, 1), (1,)
            for lo in range(0, n_q, step):
                q = min(step, n_q - lo)
                h, g = h_all[: q * n_s], g_all[: q * n_s]
                torch.add(b[lo : lo + q, None, :], a[None], out=h.view(q, n_s, width)).relu_()  # first layer
                for w, bias in layers:
                    torch.addmm(bias, h, w, out=g).relu_()
                    h, g = g, h
                torch.addmm(b_out, h, w_out, out=scores[lo : lo + q].view(q * n_s, 1))
            return scores.to(out_dtype)

    def _buffers_for(self, rows: int, width: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Two ``(rows, width)`` buffers, reused while they are large enough and of the right device and dtype."""
        ws = self._workspace
        if ws is None or ws[0].shape[0] < rows or (ws[0].shape[1], ws[0].device, ws[0].dtype) != (width, device, dtype):
            ws = self._workspace = tuple(torch.empty(rows, width, device=device, dtype=dtype) for _ in range(2))
        return ws

    def forward_concat(self, query_x: Tensor, support_x: Tensor, support_y: Tensor | None = None) -> Tensor:
        """Reference: the authors' concatenated MLP on explicit ``[x_j, x_t, onehot(y_j)]`` pairs, ``-> (Q, S)``."""
        q, s = query_x.shape[0], support_x.shape[0]
        parts = [support_x[None].expand(q, s, -1), query_x[:, None].expand(q, s, -1)]  # (Q, S, D) each
        if self.num_labels:
            onehot = nn.functional.one_hot(support_y, self.num_labels).to(support_x.dtype)  # (S, C)
            parts.append(onehot[None].expand(q, s, -1))
        return self.tail(self.first(torch.cat(parts, dim=-1)))
