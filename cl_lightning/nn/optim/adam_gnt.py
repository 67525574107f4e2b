"""AdamGnT: Adam with a step count per element, so generate-and-test can reset the state of single units.

After Dohare et al. (2024), ``lop/utils/AdamGnT.py`` (docs/baselines.md §2, which says which rule the papers ran).
:meth:`AdamGnT.reset_state` zeroes ``(t, m, v)`` of chosen rows or columns. Update rules (``update_rule``):

- ``"corrected"``: Adam with per-element t, ``m ← β1·m + (1−β1)·g``, ``v ← β2·v + (1−β2)·g²``,
  ``p ← p − lr · (m / (1−β1^t)) / (√(v / (1−β2^t)) + ε)``; without resets it equals ``torch.optim.Adam`` (tested).
- ``"reference"``: the snapshot of the authors' code the QOA paper reused, whose update is
  ``p ← p − lr · (1−β2^t) · m / (√v + ε)`` (shibhansh/loss-of-plasticity#12).

Deliberate differences from the reference: the state is created at construction (a checkpoint taken before the first
step holds it); the per-element count is stored under ``"element_step"``, not ``"step"``, which torch's
``load_state_dict`` and Lightning's device moves would leave on the device it was saved from; weight decay (coupled
L2) is added to a copy of the gradient, not to ``p.grad``; no AMSGrad.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import Tensor

UpdateRule = Literal["corrected", "reference"]
STATE_KEYS = ("element_step", "exp_avg", "exp_avg_sq")  # each parameter's (t, m, v), element by element


class AdamGnT(torch.optim.Optimizer):
    """Adam with per-element step counts and per-unit state resets.

    Args:
        params: Parameters or parameter groups.
        lr: Learning rate (QOA paper's CBP: 1e-4).
        betas: ``(β1, β2)`` of the first and second moment averages.
        eps: Added to the denominator.
        weight_decay: Coupled L2 penalty added to the gradient (reference default: 0).
        update_rule: ``"corrected"`` (standard Adam, per-element t) or ``"reference"`` (the snapshot's update,
            see the module docstring).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        update_rule: UpdateRule = "corrected",
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if update_rule not in ("corrected", "reference"):
            raise ValueError(f"update_rule must be 'corrected' or 'reference', got {update_rule!r}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.update_rule = update_rule
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p] = {key: torch.zeros_like(p, memory_format=torch.preserve_format) for key in STATE_KEYS}

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns the closure's loss if one is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            hyper = (group["lr"], *group["betas"], group["weight_decay"], group["eps"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                adam_gnt_update(p, p.grad, tuple(self.state[p][k] for k in STATE_KEYS), hyper, self.update_rule)
        return loss

    @torch.no_grad()
    def reset_state(self, param: Tensor, index: Tensor, dim: int) -> None:
        """Zero the step counts and both moments of ``param`` at ``index`` along ``dim`` (a replaced unit's row or
        column): the unit's next update is a fresh Adam step (``lop/algos/gnt.py``, ``update_optim_params``)."""
        state = self.state[param]
        for key in STATE_KEYS:
            state[key].index_fill_(dim, index.to(state[key].device), 0)


def adam_gnt_update(
    param: Tensor,
    grad: Tensor,
    moments: tuple[Tensor, Tensor, Tensor],
    hyper: tuple[float, float, float, float, float],
    update_rule: UpdateRule,
    operands: tuple[Tensor | float, ...] | None = None,
    one_minus_power: Callable[[Tensor | float, Tensor | None], Tensor] | None = None,
    scratch: tuple[Tensor | None, Tensor | None] = (None, None),
) -> None:
    """One AdamGnT update of ``param`` from ``grad`` in place, ``moments`` its ``(t, m, v)``, ``hyper``
    ``(lr, β1, β2, weight_decay, ε)``: for :class:`AdamGnT` and :class:`~cl_lightning.nn.optim.FlatAdamGnT`, which
    passes ``(β1, β2, ε, 1)`` as 0-d tensor ``operands``, its own ``one_minus_power(β, out)`` (``1 − β^t``) and two
    ``scratch`` tensors to write into."""
    lr, beta1, beta2, decay, eps = hyper
    op_beta1, op_beta2, op_eps, one = (beta1, beta2, eps, 1) if operands is None else operands
    t, m, v = moments

    def one_minus(beta: Tensor | float, out: Tensor | None) -> Tensor:
        return 1 - beta**t if one_minus_power is None else one_minus_power(beta, out)

    if decay != 0:
        grad = grad.add(param, alpha=decay)
    t.add_(one)
    m.mul_(op_beta1).add_(grad, alpha=1 - beta1)
    v.mul_(op_beta2).addcmul_(grad, grad, value=1 - beta2)
    a, b = scratch
    one_minus_beta2_t = one_minus(op_beta2, a)
    if update_rule == "corrected":  # p ← p − lr · (m / (1 − β1^t)) / (√(v / (1 − β2^t)) + ε)
        denom = torch.div(v, one_minus_beta2_t, out=a).sqrt_().add_(op_eps)
        param.addcdiv_(torch.div(m, one_minus(op_beta1, b), out=b), denom, value=-lr)
    else:  # written as the reference computes it: p ← p − lr · (1 − β2^t) / ((√v + ε) / m)
        param.addcdiv_(one_minus_beta2_t, torch.sqrt(v, out=b).add_(op_eps).div_(m), value=-lr)
