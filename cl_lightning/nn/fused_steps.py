"""Fused one-point training steps: hand-written gradients of the small regression nets and one Adam over a flat tensor.

A one-point step of slowly changing regression is a few dozen tiny tensor operations; autograd's graph and a
per-parameter Adam cost several times their arithmetic. Here the parameters become views of one flat tensor (the
modules keep them: ``state_dict``, checkpoints, probes and monitors see the same ``Parameter`` objects), the
gradients are written by hand into views of one flat gradient, and one Adam updates everything: one call of the
fused kernel (``torch._fused_adam_``, that of ``Adam(fused=True)``) when the configured Adam is fused, else its
single-tensor formulas once on the flat tensors. The optimiser's own per-parameter state is kept as views of the
flat moment tensors, so saving and loading the optimiser works unchanged.

- :class:`FlatAdam`: the flat binding and the update, with the configured Adam's hyper-parameters;
- :func:`mlp_mse_steps`: predict, MSE, gradients and update of an :class:`~cl_lightning.nn.MLP` (ReLU, linear
  output), one chunk after another;
- :func:`attention_mse_steps`: the same for query-only attention's label-free :class:`~cl_lightning.nn.PairScorer`
  (softmax over the supports, values = their targets) along a window of the stream.

The numbers are autograd's bit for bit (``tests/test_fused_steps.py``): each product is autograd's, in its operand
layout; each parameter starts on a 64-byte boundary, where a tensor of its own would (a matrix product written into
an unaligned view rounds differently); the fused kernel gets per-parameter views (its vectorised loop and scalar
tail then fall as on separate tensors). Exactness matters more than it seems: some of QOA's weights have an exact
gradient of 0 and a computed one of rounding noise, which Adam turns into steps of about ``lr``.

Call under ``torch.no_grad()`` semantics (the step functions are decorated); single process, full precision.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

_STATE = ("exp_avg", "exp_avg_sq")
_ALIGN = 16  # elements: 64 bytes of float32, the alignment of a tensor of its own on the CPU


def adam_refusal(optimizer: torch.optim.Optimizer | None, params: list[nn.Parameter]) -> str | None:
    """Why :class:`FlatAdam` cannot reproduce ``optimizer`` on ``params`` (``None`` when it can).

    It reproduces ``torch.optim.Adam`` / ``AdamW`` with one parameter group holding exactly ``params`` (one device
    and float dtype), float hyper-parameters, and none of ``amsgrad``, ``maximize``, ``differentiable``.
    """
    if not isinstance(optimizer, torch.optim.Adam):
        return f"the optimiser is {type(optimizer).__name__}, not Adam / AdamW"
    if len(optimizer.param_groups) != 1:
        return "the optimiser has several parameter groups"
    group = optimizer.param_groups[0]
    if [id(p) for p in group["params"]] != [id(p) for p in params]:
        return "the optimiser's parameters are not the net's"
    if any(group[k] for k in ("amsgrad", "maximize", "differentiable")):
        return "amsgrad, maximize or differentiable is set"
    if any(isinstance(group[k], Tensor) for k in ("lr", "eps", "weight_decay")) or any(
        isinstance(b, Tensor) for b in group["betas"]
    ):
        return "a hyper-parameter is a tensor"
    if len({(p.device, p.dtype) for p in params}) != 1 or not params[0].dtype.is_floating_point:
        return "the parameters are not of one device and float dtype"
    return None


class FlatAdam:
    """The configured Adam on one flat tensor whose views are the parameters (one fused kernel a step).

    :meth:`bind` (once per batch of steps) makes the parameters and the optimiser's ``exp_avg`` / ``exp_avg_sq``
    views of flat tensors, adopting whatever values they hold (a loaded checkpoint's), and reads the step count;
    :meth:`counts` numbers the coming updates and :meth:`update` applies one from :attr:`grad`; :meth:`release`
    writes the step count back into every parameter's state (the moments are the flat state itself), after which
    the optimiser may be saved, stepped on its own or loaded; the next :meth:`bind` adopts what it then holds.
    """

    def __init__(self) -> None:
        self.params: list[nn.Parameter] = []
        self.flat = self.grad = torch.empty(0)
        self.moments: dict[str, Tensor] = {}
        self.step_count = torch.zeros(())
        self.grads: list[Tensor] = []  # views of grad shaped as the parameters
        self._hyper: dict[str, float | bool] = {}
        self._fused, self._decoupled, self._host_count = True, False, 0
        self._offsets: list[int] = []  # each parameter's first element in the flat tensors, then their length
        self._views: tuple[list[Tensor], ...] = ()
        self._optimizer: torch.optim.Adam | None = None

    def bind(self, optimizer: torch.optim.Adam, params: list[nn.Parameter]) -> FlatAdam:
        """Bind ``params`` and ``optimizer``'s state to flat tensors (no copy when they already are bound)."""
        if not self._is_bound(optimizer, params):
            self._flatten(optimizer, params)
        group = optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        self._hyper = {
            "lr": group["lr"], "beta1": beta1, "beta2": beta2, "weight_decay": group["weight_decay"],
            "eps": group["eps"], "amsgrad": False, "maximize": False,
        }  # fmt: skip
        self._decoupled = bool(group.get("decoupled_weight_decay", False))
        self._fused = bool(group["fused"])
        self.step_count.copy_(optimizer.state[params[0]]["step"])
        if not self._fused:  # the unfused optimiser's step is a CPU tensor: read without a device synchronisation
            self._host_count = int(optimizer.state[params[0]]["step"])
        state = optimizer.state
        self._views = (  # the fused kernel's lists: per-parameter views, so it rounds as on separate tensors
            self.params,
            self.grads,
            [state[p]["exp_avg"] for p in params],
            [state[p]["exp_avg_sq"] for p in params],
        )
        return self

    def counts(self, steps: int) -> list[Tensor] | list[int]:
        """The step numbers of the next ``steps`` updates (0-d tensors for the fused kernel, made in one operation;
        host integers for the unfused formulas); the count itself advances by ``steps``."""
        start = self._host_count
        self.step_count.add_(steps)
        self._host_count = start + steps
        if not self._fused:
            return list(range(start + 1, start + steps + 1))
        return list((self.step_count + torch.arange(1 - steps, 1, device=self.step_count.device)).unbind())

    def update(self, count: Tensor) -> None:
        """One Adam update of the flat parameters from :attr:`grad`, step number ``count`` (from :meth:`counts`), as
        the configured Adam computes it: its fused kernel when it is fused, else its single-tensor formulas (the same
        numbers, bit for bit, as the optimiser on the separate parameters)."""
        if self._fused:
            kernel = torch._fused_adamw_ if self._decoupled else torch._fused_adam_
            kernel(*self._views, [], [count] * len(self.params), **self._hyper)
            return
        lr, beta1, beta2, decay, eps = (self._hyper[k] for k in ("lr", "beta1", "beta2", "weight_decay", "eps"))
        param, grad, exp_avg, exp_avg_sq = self.flat, self.grad, self.moments["exp_avg"], self.moments["exp_avg_sq"]
        if decay != 0 and self._decoupled:
            param.mul_(1 - lr * decay)
        elif decay != 0:
            grad = grad.add(param, alpha=decay)
        step = float(count)  # a host count here: the unfused optimiser keeps its step on the CPU
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-(lr / (1 - beta1**step)))

    def release(self) -> None:
        """Write the step count back into every parameter's optimiser state."""
        state = self._optimizer.state
        for p in self.params:
            state[p]["step"].copy_(self.step_count)

    def _is_bound(self, optimizer: torch.optim.Adam, params: list[nn.Parameter]) -> bool:
        if optimizer is not self._optimizer or [id(p) for p in params] != [id(p) for p in self.params]:
            return False
        state, bases = optimizer.state, (self.flat, *(self.moments[k] for k in _STATE))
        for p, offset in zip(params, self._offsets, strict=False):
            views = (p, *(state[p].get(k) for k in _STATE)) if p in state else ()
            if not views or any(not _is_view(v, b, offset) for v, b in zip(views, bases, strict=True)):
                return False
        return True

    @torch.no_grad()
    def _flatten(self, optimizer: torch.optim.Adam, params: list[nn.Parameter]) -> None:
        """Copy the parameters and their Adam state into flat tensors and point both at views of them.

        Each parameter starts on a 64-byte boundary (zero padding between them, which Adam leaves at zero), where a
        tensor of its own would start: matrix products and vectorised loops then round as on separate tensors.
        """
        p0, state = params[0], optimizer.state
        self.params, self._optimizer = list(params), optimizer
        self._offsets = [0]
        for p in params:
            self._offsets.append(self._offsets[-1] + -(-p.numel() // _ALIGN) * _ALIGN)
        self.flat = p0.new_zeros(self._offsets[-1])
        self.grad = torch.zeros_like(self.flat)
        self.moments = {name: torch.zeros_like(self.flat) for name in _STATE}
        fresh = p0 not in state or "step" not in state[p0]
        self.step_count = torch.zeros((), dtype=torch.float32, device=p0.device)
        if not fresh:
            self.step_count.copy_(state[p0]["step"])
        group = optimizer.param_groups[0]
        self.grads = []
        for p, offset in zip(params, self._offsets, strict=False):
            view = self.flat[offset : offset + p.numel()].view(p.shape)
            view.copy_(p.detach())
            p.data = view
            self.grads.append(self.grad[offset : offset + p.numel()].view(p.shape))
            entry = state[p]
            if fresh:  # as Adam creates it: on the parameters' device when fused or capturable, else on the CPU
                on_device = group["fused"] or group["capturable"]
                entry["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
            for name in _STATE:
                moment = self.moments[name][offset : offset + p.numel()].view(p.shape)
                if name in entry:
                    moment.copy_(entry[name])
                entry[name] = moment


def _is_view(t: Tensor | None, base: Tensor, offset: int) -> bool:
    return t is not None and t.data_ptr() == base.data_ptr() + offset * base.element_size() and t.is_contiguous()


def _mse_grad(diff: Tensor, n: int) -> Tensor:
    """``∂ mean(diff²) / ∂ diff`` as autograd rounds it: ``(1 / n) · (2 · diff)`` (in place on ``diff``)."""
    g = diff.mul_(2.0)
    return g if n == 1 else g.mul_(1.0 / n)


def _layer_grads(layers: list[nn.Linear], adam: FlatAdam) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """``(weightᵀ, bias, ∂weight, ∂bias)`` per layer: views, taken once per batch of steps."""
    index = {id(p): g for p, g in zip(adam.params, adam.grads, strict=True)}
    return [(m.weight.t(), m.bias, index[id(m.weight)], index[id(m.bias)]) for m in layers]


@torch.no_grad()
def mlp_mse_steps(layers: list[nn.Linear], adam: FlatAdam, xs: Tensor, ys: Tensor) -> Tensor:
    """Train an MLP (ReLU between ``layers``, linear output) one chunk at a time: predict chunk ``t``, then one Adam
    step on its MSE. ``xs (T, B, D)``, ``ys (T, B, k)`` ``-> predictions (T, B, k)``, each made before its step.

    Autograd's formulas: loss ``mean((pred - y)²)``, ``∂/∂pred = 2 (pred - y) / N``; per layer ``∂W = gᵀ h``,
    ``∂b = Σ_B g``, ``g ← (g W) · 1[h > 0]``. ``adam`` is bound to the layers' parameters.
    """
    plan = _layer_grads(layers, adam)
    n = ys.shape[1] * ys.shape[2]
    preds = []
    for x, y, count in zip(xs.unbind(0), ys.unbind(0), adam.counts(xs.shape[0]), strict=True):  # a loop over time
        hs = [x]
        for w_t, b, _, _ in plan[:-1]:
            hs.append(torch.addmm(b, hs[-1], w_t).relu_())  # (B, H)
        w_t, b, _, _ = plan[-1]
        pred = torch.addmm(b, hs[-1], w_t)  # (B, k)
        preds.append(pred)
        g = _mse_grad(pred - y, n)  # ∂loss/∂pred
        for i in range(len(plan) - 1, -1, -1):  # backward, layer by layer
            _, _, g_w, g_b = plan[i]
            torch.mm(g.t(), hs[i], out=g_w)
            torch.sum(g, 0, out=g_b)
            if i:
                g = torch.ops.aten.threshold_backward(g.mm(plan[i][0].t()), hs[i], 0)
        adam.update(count)
    return torch.stack(preds)


@torch.no_grad()
def attention_mse_steps(
    first: nn.Linear, layers: list[nn.Linear], adam: FlatAdam, window_x: Tensor, window_y: Tensor, support_size: int
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
    (_, b0, g_w0, g_b0), w0 = plan[0], first.weight
    ws_t, wq_t, g_ws, g_wq = w0[:, :d].t(), w0[:, d:].t(), g_w0[:, :d], g_w0[:, d:]
    preds = []
    for sx, sy, qx, qy, count in zip(sxs, sys, qxs, qys, adam.counts(steps), strict=True):  # a loop over time
        hs = [torch.mm(sx, ws_t).add_(torch.addmm(b0, qx, wq_t)).relu_()]  # (S, H): the factorised first layer
        for w_t, b, _, _ in plan[1:-1]:
            hs.append(torch.addmm(b, hs[-1], w_t).relu_())
        w_t, b, _, _ = plan[-1]
        p = torch.addmm(b, hs[-1], w_t).view(1, -1).softmax(-1)  # (1, S)
        pred = p @ sy  # (1, k)
        preds.append(pred)
        g_p = _mse_grad(pred - qy, k) @ sy.t()  # (1, S)
        g = torch._softmax_backward_data(g_p, p, -1, p.dtype).view(-1, 1)  # ∂loss/∂scores (S, 1)
        for i in range(len(plan) - 1, 0, -1):  # the layers after the first, backward
            _, _, g_w, g_b = plan[i]
            torch.mm(g.t(), hs[i - 1], out=g_w)
            torch.sum(g, 0, out=g_b)
            g = torch.ops.aten.threshold_backward(g.mm(plan[i][0].t()), hs[i - 1], 0)  # (S, H)
        g_ws.copy_(torch.mm(sx.t(), g).t())  # autograd's product for W_sᵀ (its layout, so its rounding)
        torch.sum(g, 0, out=g_b0)
        torch.outer(g_b0, qx[0], out=g_wq)
        adam.update(count)
    return torch.stack(preds)
