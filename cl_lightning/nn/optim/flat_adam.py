"""The configured Adam on one flat tensor whose views are the parameters: what the fused steps of
:mod:`cl_lightning.nn.fused_steps` and the native kernel (through :class:`AdamHyperparameters`) update with.

The optimiser's own per-parameter state is kept as views of flat state tensors, so saving, loading and stepping the
optimiser on its own work unchanged, and :meth:`AdamGnT.reset_state <cl_lightning.nn.optim.AdamGnT.reset_state>`
writes into the same storage. The numbers are the optimiser's bit for bit (``tests/test_fused_steps.py``): each
parameter starts on a 64-byte boundary, where a tensor of its own would; an operation whose vectorised loop and
scalar tail round differently (the fused kernel; ``pow``, SLEEF's in the vectorised loop) runs on per-parameter views;
the rest (``+ − × ÷ √``, ``lerp``, ``addcmul``, ``addcdiv``) runs once on the flat tensors.
"""

from __future__ import annotations

import itertools
from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

from cl_lightning.nn.optim.adam_gnt import STATE_KEYS, AdamGnT, adam_gnt_update

_ALIGN = 16  # elements: 64 bytes of float32, the alignment of a tensor of its own on the CPU


def adam_refusal(optimizer: torch.optim.Optimizer | None, params: list[nn.Parameter]) -> str | None:
    """Why neither :class:`FlatAdam` nor :class:`FlatAdamGnT` can reproduce ``optimizer`` on ``params`` (``None``
    when one can).

    They reproduce ``torch.optim.Adam`` / ``AdamW`` (none of ``amsgrad``, ``maximize``, ``differentiable``) and
    :class:`~cl_lightning.nn.optim.AdamGnT`, with one parameter group holding exactly ``params`` (one device and
    float dtype) and float hyper-parameters.
    """
    if not isinstance(optimizer, (torch.optim.Adam, AdamGnT)):
        return f"the optimiser is {type(optimizer).__name__}, not Adam / AdamW / AdamGnT"
    if len(optimizer.param_groups) != 1:
        return "the optimiser has several parameter groups"
    group = optimizer.param_groups[0]
    if [id(p) for p in group["params"]] != [id(p) for p in params]:
        return "the optimiser's parameters are not the net's"
    if any(group.get(k) for k in ("amsgrad", "maximize", "differentiable")):
        return "amsgrad, maximize or differentiable is set"
    if any(isinstance(v, Tensor) for v in (group["lr"], group["eps"], group["weight_decay"], *group["betas"])):
        return "a hyper-parameter is a tensor"
    if len({(p.device, p.dtype) for p in params}) != 1 or not params[0].dtype.is_floating_point:
        return "the parameters are not of one device and float dtype"
    return None


class AdamHyperparameters(NamedTuple):
    """The hyper-parameters a :class:`FlatAdam` or :class:`FlatAdamGnT` was last bound to (its
    ``hyperparameters``)."""

    lr: float
    beta1: float
    beta2: float
    weight_decay: float
    eps: float
    decoupled: bool = False  # AdamW: decay the parameters, not the gradient (FlatAdam)
    update_rule: Literal["corrected", "reference"] | None = None  # AdamGnT's (FlatAdamGnT); None for Adam


class _FlatState:
    """Parameters, their gradients and the optimiser's per-element state named :attr:`state_keys` as views of flat
    tensors (bound by the subclasses' ``bind``)."""

    state_keys: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.params: list[nn.Parameter] = []
        self.flat = self.grad = torch.empty(0)
        self.moments: dict[str, Tensor] = {}  # state key -> its flat tensor
        self.grads: list[Tensor] = []  # views of grad shaped as the parameters
        self._offsets: list[int] = []  # each parameter's first element in the flat tensors, then their length
        self._optimizer: torch.optim.Optimizer | None = None

    def views(self, flat: Tensor) -> list[Tensor]:
        """Per-parameter views of a flat tensor laid out as :attr:`flat`, shaped as the parameters."""
        return [flat[o : o + p.numel()].view(p.shape) for p, o in zip(self.params, self._offsets, strict=False)]

    def _is_bound(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> bool:
        if optimizer is not self._optimizer or [id(p) for p in params] != [id(p) for p in self.params]:
            return False
        state, bases = optimizer.state, (self.flat, *(self.moments[k] for k in self.state_keys))
        for p, offset in zip(params, self._offsets, strict=False):
            views = (p, *(state[p].get(k) for k in self.state_keys)) if p in state else ()
            if not views or any(not _is_view(v, b, offset) for v, b in zip(views, bases, strict=True)):
                return False
        return True

    @torch.no_grad()
    def _flatten(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
        """Copy the parameters and their optimiser state into flat tensors, 64-byte aligned (the padding stays
        zero), and point both at views of them."""
        state = optimizer.state
        self.params, self._optimizer = list(params), optimizer
        self._offsets = [0, *itertools.accumulate(-(-p.numel() // _ALIGN) * _ALIGN for p in params)]
        self.flat = params[0].new_zeros(self._offsets[-1])
        self.grad = torch.zeros_like(self.flat)
        self.moments = {name: torch.zeros_like(self.flat) for name in self.state_keys}
        for p, view in zip(params, self.views(self.flat), strict=True):
            view.copy_(p.detach())
            p.data = view
        self.grads = self.views(self.grad)
        for name, flat in self.moments.items():
            for p, moment in zip(params, self.views(flat), strict=True):
                entry = state[p]
                if name in entry:
                    moment.copy_(entry[name])
                entry[name] = moment


class FlatAdam(_FlatState):
    """``torch.optim.Adam`` / ``AdamW`` on one flat tensor whose views are the parameters (one fused kernel a step).

    :meth:`bind` (once per batch of steps) makes the parameters and the optimiser's ``exp_avg`` / ``exp_avg_sq``
    views of flat tensors, adopting whatever values they hold (a loaded checkpoint's), and reads the step count;
    :meth:`counts` numbers the coming updates, :meth:`update` applies one from :attr:`grad`; :meth:`release` writes
    the step count back (the moments are the flat state itself), and the optimiser is an ordinary one again.
    """

    state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self) -> None:
        super().__init__()
        self.step_count = torch.zeros(())
        self._hyper: dict[str, float | bool] = {}
        self._fused, self._decoupled, self._host_count = True, False, 0
        self._views: tuple[list[Tensor], ...] = ()

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
        state = optimizer.state  # the fused kernel's lists: per-parameter views, so it rounds as on separate tensors
        self._views = (self.params, self.grads, *([state[p][key] for p in params] for key in self.state_keys))
        return self

    @property
    def hyperparameters(self) -> AdamHyperparameters:
        """The bound optimiser's hyper-parameters (Adam, or AdamW when ``decoupled``)."""
        h = self._hyper
        return AdamHyperparameters(h["lr"], h["beta1"], h["beta2"], h["weight_decay"], h["eps"], self._decoupled)

    def counts(self, steps: int) -> list[Tensor] | list[int]:
        """The step numbers of the next ``steps`` updates (0-d tensors for the fused kernel, made in one operation;
        host integers for the unfused formulas); the count itself advances by ``steps``."""
        start = self._host_count
        self.step_count.add_(steps)
        self._host_count = start + steps
        if not self._fused:
            return list(range(start + 1, start + steps + 1))
        return list((self.step_count + torch.arange(1 - steps, 1, device=self.step_count.device)).unbind())

    def advance(self, steps: int) -> int:
        """The step number of the first of the next ``steps`` updates, as a host integer, the count advanced by
        ``steps`` (:meth:`counts` without the per-step numbers: for a kernel that numbers its own steps)."""
        first = (self._host_count if not self._fused else int(self.step_count)) + 1
        self.step_count.add_(steps)
        self._host_count += steps
        return first

    def update(self, count: Tensor | int) -> None:
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

    @torch.no_grad()
    def _flatten(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
        p0, state = params[0], optimizer.state
        if p0 not in state or "step" not in state[p0]:  # a fresh optimiser: its step count as Adam creates it, on
            group = optimizer.param_groups[0]  # the parameters' device when fused or capturable, else on the CPU
            device = p0.device if group["fused"] or group["capturable"] else "cpu"
            for p in params:
                state[p]["step"] = torch.zeros((), dtype=torch.float32, device=device)
        super()._flatten(optimizer, params)
        self.step_count = torch.zeros((), dtype=torch.float32, device=p0.device)


class FlatAdamGnT(_FlatState):
    """:class:`~cl_lightning.nn.optim.AdamGnT` on one flat tensor whose views are the parameters, bound and stepped
    as :class:`FlatAdam`; the step counts (``element_step``) are part of the flat state, so :meth:`counts` numbers
    nothing and :meth:`release` has nothing to write."""

    state_keys = STATE_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._hyper: tuple[float, ...] = ()
        self._operands: tuple[Tensor | float, ...] = ()  # β1, β2, ε, 1 as operands (scalar_operand)
        self._rule = "corrected"
        self._scratch: tuple[Tensor, ...] = ()  # β^t (zero in the padding), then the update's two operands
        self._powers: list[tuple[Tensor, Tensor]] = []  # (the step counts, β^t) of each parameter: views

    def bind(self, optimizer: AdamGnT, params: list[nn.Parameter]) -> FlatAdamGnT:
        """Bind ``params`` and ``optimizer``'s state to flat tensors (no copy when they already are bound)."""
        if not self._is_bound(optimizer, params):
            self._flatten(optimizer, params)
            self._scratch = tuple(torch.zeros_like(self.flat) for _ in range(3))
            counts = self.views(self.moments["element_step"])
            self._powers = list(zip(counts, self.views(self._scratch[0]), strict=True))
        group = optimizer.param_groups[0]
        self._hyper = (group["lr"], *group["betas"], group["weight_decay"], group["eps"])
        self._operands = tuple(scalar_operand(c, self.flat) for c in (*group["betas"], group["eps"], 1.0))
        self._rule = optimizer.update_rule
        return self

    @property
    def hyperparameters(self) -> AdamHyperparameters:
        """The bound optimiser's hyper-parameters and update rule (``"corrected"`` or ``"reference"``)."""
        lr, beta1, beta2, decay, eps = self._hyper
        return AdamHyperparameters(lr, beta1, beta2, decay, eps, update_rule=self._rule)

    def counts(self, steps: int) -> list[None]:
        """Nothing to number: every element keeps its own step count."""
        return [None] * steps

    def update(self, count: None = None) -> None:
        """One AdamGnT update of the flat parameters from :attr:`grad`: ``AdamGnT.step``'s
        (:func:`~cl_lightning.nn.optim.adam_gnt.adam_gnt_update`), each operation once on the flat tensors but
        ``β^t``, per parameter view."""
        moments = tuple(self.moments[k] for k in self.state_keys)
        operands, powers = self._operands, self._one_minus_power
        adam_gnt_update(self.flat, self.grad, moments, self._hyper, self._rule, operands, powers, self._scratch[1:])

    def release(self) -> None:
        """Nothing to write back: the flat state is the optimiser's state."""

    def _one_minus_power(self, beta: Tensor | float, out: Tensor) -> Tensor:
        """``1 − β^t`` into ``out`` (one in the padding, where ``β^t`` stays zero)."""
        powers = self._scratch[0]
        for t, power in self._powers:  # per parameter: pow rounds differently in its vectorised loop and its tail
            torch.pow(beta, t, out=power)
        return torch.sub(self._operands[3], powers, out=out)


FlatOptimizer = FlatAdam | FlatAdamGnT  # what the fused steps update with


def flat_optimizer_type(optimizer: torch.optim.Optimizer) -> type[FlatOptimizer]:
    """The flat optimiser that reproduces ``optimizer``: :class:`FlatAdamGnT` for an AdamGnT, else :class:`FlatAdam`."""
    return FlatAdamGnT if isinstance(optimizer, AdamGnT) else FlatAdam


def scalar_operand(value: float, like: Tensor) -> Tensor | float:
    """``value`` as the constant operand of an elementwise operation on ``like``: on the CPU in float32 / float64 /
    int64 a 0-d tensor of its dtype (the same result as the Python number, without wrapping it into a fresh tensor
    each call); the number itself elsewhere (reduced precision and accelerators treat numbers otherwise)."""
    if like.device.type == "cpu" and like.dtype in (torch.float32, torch.float64, torch.int64):
        return torch.tensor(value, dtype=like.dtype)
    return value


def _is_view(t: Tensor | None, base: Tensor, offset: int) -> bool:
    return t is not None and t.data_ptr() == base.data_ptr() + offset * base.element_size() and t.is_contiguous()
