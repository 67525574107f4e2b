"""Fused training steps: hand-written gradients of the small nets and one Adam over a flat tensor.

On a one-point step autograd's graph and a per-parameter Adam cost several times the arithmetic. Here the gradients
are written by hand into views of one flat gradient and one Adam updates every parameter at once
(:mod:`cl_lightning.nn.optim.flat_adam`: the modules, checkpoints and monitors see the same ``Parameter`` objects
and optimiser state): :func:`mlp_steps` for an :class:`~cl_lightning.nn.MLP`, :func:`attention_mse_steps` for
query-only attention's label-free :class:`~cl_lightning.nn.PairScorer` and :class:`AttentionCEStep` for its
classification step.

The numbers are autograd's bit for bit (``tests/test_fused_steps.py``): each product is autograd's, in its operand
layout. That matters: some of QOA's weights have an exact gradient of 0 and a computed one of rounding noise, which
Adam turns into steps of about ``lr``. Single process, full precision. A fast path that computes a module's output
without calling it would skip its forward hooks (a monitor's probe), so it runs only where :func:`has_forward_hooks`
finds none (here, and the scorer's blocked pass).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch
from torch import Tensor, nn

from cl_lightning.nn.optim import FlatOptimizer

__all__ = ["AttentionCEStep", "attention_mse_steps", "has_forward_hooks", "mlp_steps"]


def has_forward_hooks(modules: Iterable[nn.Module]) -> bool:
    """Whether any of ``modules`` has a forward or forward-pre hook of its own (global hooks are not counted)."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _mse_grad(pred: Tensor, y: Tensor, n: int) -> Tensor:
    """``∂ mean((pred - y)²) / ∂ pred`` over ``n`` elements as autograd rounds it: ``(1 / n) · (2 · (pred - y))``."""
    g = (pred - y).mul_(2.0)
    return g if n == 1 else g.mul_(1.0 / n)


Plan = list[tuple[Tensor, Tensor, Tensor, Tensor]]  # (weightᵀ, bias, ∂weight, ∂bias) per layer: views


def _layer_grads(layers: list[nn.Linear], adam: FlatOptimizer) -> Plan:
    """``(weightᵀ, bias, ∂weight, ∂bias)`` per layer: views, taken once per batch of steps."""
    index = {id(p): g for p, g in zip(adam.params, adam.grads, strict=True)}
    return [(m.weight.t(), m.bias, index[id(m.weight)], index[id(m.bias)]) for m in layers]


def _forward(plan: Plan, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """The output of ``plan``'s layers (ReLU between them, the last linear) on ``x (B, D)``, and each layer's input
    (``x``, then the post-ReLU features ``(B, H)``)."""
    hs = [x]
    for w_t, b, _, _ in plan[:-1]:
        hs.append(torch.addmm(b, hs[-1], w_t).relu_())  # (B, H)
    w_t, b, _, _ = plan[-1]
    return torch.addmm(b, hs[-1], w_t), hs


def _backward(plan: Plan, hs: list[Tensor], g: Tensor, to_input: bool) -> Tensor:
    """Write the gradients of ``plan``'s layers, inputs ``hs`` (:func:`_forward`'s), from ``g``, their output's
    gradient, layer by layer; with ``to_input``, return the gradient through the ReLU that made ``hs[0]``."""
    for i in range(len(plan) - 1, -1, -1):
        _, _, g_w, g_b = plan[i]
        torch.mm(g.t(), hs[i], out=g_w)
        torch.sum(g, 0, out=g_b)
        if i or to_input:
            g = torch.ops.aten.threshold_backward(g.mm(plan[i][0].t()), hs[i], 0)
    return g


def _cross_entropy(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """``CE(logits, y)`` (mean over the batch) and its gradient ``∂ CE / ∂ logits`` by autograd's own kernels:
    ``log_softmax`` and ``nll_loss``, then their backward, as ``F.cross_entropy(logits, y).backward()`` runs them."""
    logp = torch.log_softmax(logits, 1)
    loss, total = torch.ops.aten.nll_loss_forward(logp, y, None, 1, -100)  # reduction 1: mean; -100: ignore none
    g = torch.ops.aten.nll_loss_backward(logits.new_ones(()), logp, y, None, 1, -100, total)
    return loss, torch.ops.aten._log_softmax_backward_data(g, logp, 1, logits.dtype)


def _cross_entropy_grad(logits: Tensor, y: Tensor) -> Tensor:
    """``∂ CE(logits, y) / ∂ logits`` (:func:`_cross_entropy`'s gradient)."""
    return _cross_entropy(logits, y)[1]


@torch.no_grad()
def mlp_steps(
    layers: list[nn.Linear],
    adam: FlatOptimizer,
    xs: Tensor,
    ys: Tensor,
    after_step: Callable[[list[Tensor]], object] | None = None,
) -> Tensor:
    """Train an MLP (ReLU between ``layers``, linear output) one chunk at a time: predict chunk ``t``, then one Adam
    step on its loss. ``xs (T, B, D)`` ``-> predictions (T, B, k)``, each made before its step; ``ys (T, B)``
    integer labels (cross-entropy on the logits) or ``(T, B, k)`` targets (MSE).

    Per layer ``∂W = gᵀ h``, ``∂b = Σ_B g``, ``g ← (g W) · 1[h > 0]``. ``adam`` is bound to the layers' parameters.
    ``after_step``, when given, is called after each update with that step's post-ReLU features ``(B, H)`` per hidden
    layer, from the forward pass before the update (Continual Backprop's generate-and-test).
    """
    plan = _layer_grads(layers, adam)
    if ys.dim() == 2:  # labels: cross-entropy on the logits
        loss_grad: Callable[[Tensor, Tensor], Tensor] = _cross_entropy_grad
    else:  # targets: the MSE over each step's B · k elements
        ys = ys.to(xs.dtype)
        loss_grad = partial(_mse_grad, n=ys.shape[1] * ys.shape[2])
    preds = []
    for x, y, count in zip(xs.unbind(0), ys.unbind(0), adam.counts(xs.shape[0]), strict=True):  # a loop over time
        pred, hs = _forward(plan, x)  # (B, k), each layer's input
        _backward(plan, hs, loss_grad(pred, y), to_input=False)
        adam.update(count)
        preds.append(pred)
        if after_step is not None:
            after_step(hs[1:])
    return torch.stack(preds)


@torch.no_grad()
def attention_mse_steps(
    first: nn.Linear,
    layers: list[nn.Linear],
    adam: FlatOptimizer,
    window_x: Tensor,
    window_y: Tensor,
    support_size: int,
) -> Tensor:
    """Train label-free query-only attention along a window of the stream: point ``S + t`` is the query of step
    ``t``, the ``S`` points before it its supports. ``window_x (S + T, D)``, ``window_y (S + T, k)``
    ``-> predictions (T, 1, k)``, each made before its step.

    ``first``: the :class:`~cl_lightning.nn.PairScorer`'s first layer, weight ``[W_s | W_q]`` on ``[x_j, x_t]``;
    ``layers``: the layers after it (hidden…, out). Scores ``s_j = Q(x_t, x_j)``, ``pred = softmax(s) @ y_S``, loss
    ``mean((pred - y_t)²)``; the gradients are autograd's formulas, the first layer's split as in the forward
    (``∂W_s = gᵀ x_S``, ``∂W_q = (Σ_S g) ⊗ x_t``).
    """
    s, d = support_size, window_x.shape[1]
    steps, k = window_x.shape[0] - s, window_y.shape[1]
    sxs = window_x.as_strided((steps, s, d), (d, d, 1)).unbind(0)  # (S, D) supports of each step, views
    sys = window_y.as_strided((steps, s, k), (k, k, 1)).unbind(0)
    qxs, qys = window_x[s:, None].unbind(0), window_y[s:, None].unbind(0)  # (1, D), (1, k)
    plan = _layer_grads([first, *layers], adam)
    (_, b0, g_w0, g_b0), w0, tail = plan[0], first.weight, plan[1:]
    ws_t, wq_t, g_ws, g_wq = w0[:, :d].t(), w0[:, d:].t(), g_w0[:, :d], g_w0[:, d:]
    preds = []
    for sx, sy, qx, qy, count in zip(sxs, sys, qxs, qys, adam.counts(steps), strict=True):  # a loop over time
        h = torch.mm(sx, ws_t).add_(torch.addmm(b0, qx, wq_t)).relu_()  # (S, H): the factorised first layer
        scores, hs = _forward(tail, h)  # (S, 1)
        p = scores.view(1, -1).softmax(-1)  # (1, S)
        pred = p @ sy  # (1, k)
        preds.append(pred)
        g_p = _mse_grad(pred, qy, k) @ sy.t()  # (1, S)
        g = torch._softmax_backward_data(g_p, p, -1, p.dtype).view(-1, 1)  # ∂loss/∂scores (S, 1)
        g = _backward(tail, hs, g, to_input=True)  # ∂loss/∂(the first layer's pre-activation) (S, H)
        g_ws.copy_(torch.mm(sx.t(), g).t())  # autograd's product for W_sᵀ (its layout, so its rounding)
        torch.sum(g, 0, out=g_b0)
        torch.outer(g_b0, qx[0], out=g_wq)
        adam.update(count)
    return torch.stack(preds)


class AttentionCEStep:
    """One classification step of query-only attention on a :class:`~cl_lightning.nn.PairScorer`: queries ``qx (Q,
    D)``, ``qy (Q,)`` over supports ``sx (S, D)``, ``sy (S,)``, logits ``z_c = Σ_j Q(x_t, x_j, y_j) · 1[y_j = c]``, loss
    ``CE(z, qy)``: :meth:`gradients` ``-> (loss, logits)`` into ``adam``'s flat gradient, then :meth:`update`.
    The forward is :meth:`PairScorer.forward`'s gradient path op for op (``Q · S`` up to its ``pair_budget``: the
    pairs at once), the gradients autograd's formulas in its layouts (``sum_to_size`` for the broadcast sum,
    ``index_put`` with accumulation for the label columns ``W_y``)."""

    def __init__(self, scorer: nn.Module, num_classes: int, adam: FlatOptimizer) -> None:
        self.scorer, self.adam, d = scorer, adam, scorer.x_dim
        self.plan = _layer_grads([scorer.first, *scorer.hidden, scorer.out], adam)
        _, _, g_w0, self.g_b0 = self.plan[0]
        self.g_ws, self.g_wq, self.g_wy = g_w0[:, :d], g_w0[:, d : 2 * d], g_w0[:, 2 * d :]  # (H, D), (H, D), (H, C)
        self.classes = torch.arange(num_classes, device=g_w0.device)

    @torch.no_grad()
    def gradients(self, qx: Tensor, qy: Tensor, sx: Tensor, sy: Tensor) -> tuple[Tensor, Tensor]:
        """The step's loss and logits, its gradients written into ``adam``'s flat gradient."""
        a, b = self.scorer.support_part(sx, sy), self.scorer.query_part(qx)  # (S, H), (Q, H): the scorer's own ops
        n_q, n_s, width = qx.shape[0], sx.shape[0], a.shape[1]
        h = (b[:, None, :] + a[None]).view(n_q * n_s, width).relu()  # (Q·S, H): the first layer over every pair
        scores, hs = _forward(self.plan[1:], h)  # (Q·S, 1)
        onehot = (sy[:, None] == self.classes).to(sx.dtype)  # (S, C)
        logits = scores.view(n_q, n_s).mm(onehot)  # (Q, C)
        loss, g = _cross_entropy(logits, qy)
        g = _backward(self.plan[1:], hs, g.mm(onehot.t()).view(n_q * n_s, 1), to_input=True).view(n_q, n_s, width)
        g_q = g.sum_to_size(n_q, 1, width).view(n_q, width)  # autograd's reductions of the broadcast sum
        g_s = g.sum_to_size(1, n_s, width).view(n_s, width)
        torch.sum(g_q, 0, out=self.g_b0)
        self.g_wq.copy_(torch.mm(qx.t(), g_q).t())
        self.g_ws.copy_(torch.mm(sx.t(), g_s).t())
        if self.g_wy.numel():  # label columns: autograd's backward of indexing, index_put accumulating into zeros
            zeros = g_s.new_zeros(self.g_wy.shape[::-1])  # (C, H)
            self.g_wy.copy_(torch.ops.aten._index_put_impl_(zeros, [sy], g_s, True, True).t())
        return loss, logits

    def update(self, loss: Tensor | None = None) -> None:
        """One update of ``adam`` from the last :meth:`gradients` (``loss`` unused: ``run.step``'s signature)."""
        (count,) = self.adam.counts(1)
        self.adam.update(count)
