"""Generate-and-test: the unit-replacement step of Continual Backprop (Dohare et al. 2024, ``lop/algos/gnt.py``).

Run after each optimiser step on the post-activation features ``h`` of the forward pass before that step
(docs/baselines.md §2). For every hidden layer, with η = ``decay_rate``:

1. ``age += 1``; bias correction ``bc = 1 − η^age``.
2. ``util ← η·util``; ``mean_act ← η·mean_act + (1−η)·mean_batch(h)``; ``ĥ = mean_act / bc``.
3. ``out_mag`` = mean |outgoing weight| of each unit, ``in_mag`` = mean |incoming weight|, and
   ``contribution``: ``out_mag · mean_batch|h|`` (Eq. 1 of the Nature paper up to a per-layer constant) or
   ``adaptable_contribution``: ``out_mag · mean_batch|h − ĥ| / in_mag`` (the MNIST default of the reference).
4. ``util ← util + (1−η)·new_util``; ``bias_corrected_util = util / bc``.
5. Units with ``age > maturity_threshold`` are eligible; ``replacement_rate · #eligible`` of them are replaced,
   the fractional part carried over (``accumulate=True``) or, below one, one unit with that probability.
6. The eligible units of smallest ``bias_corrected_util`` get ``util = mean_act = 0``, fresh incoming weights
   ``U(−b, b)`` (``b = gain(ReLU)·√(3/fan_in)`` for ``"kaiming"``), incoming bias 0, outgoing weights 0, age 0,
   and, with :class:`~cl_lightning.nn.optim.AdamGnT`, zeroed Adam state for their incoming row, bias and
   outgoing column (SGD state is left alone, as the reference).

Quirks of the reference kept as options with the faithful default:

- ``next_bias_correction=False``: the reference adds ``Σ_units W_next[:, u] · ĥ_u`` to the next layer's bias to
  keep the function unchanged, but reads ``mean_act`` after step 6 zeroed it, so it adds 0. ``True`` applies it
  with ĥ from before the reset.
- With ``replacement_rate = 0`` the reference returns before updating ages and utilities; so does this.
- Ties in utility are broken towards the lower unit index (the reference's ``topk`` leaves them unspecified).

All state is in registered buffers (per hidden layer ``i``: ``util_i``, ``bias_corrected_util_i``, ``mean_act_i``,
``age_i``, ``to_replace_i`` (the carried fraction, float64 as the reference's Python float), ``replaced_i`` (a count)).

No host synchronisation per step: how many units a layer replaces depends only on past replacement counts, so the
counts are kept on the host (:class:`HostCounts`, rebuilt from the buffers on load) and the replaced units are the
first ``count`` eligible ones by utility, with no device read (as the reference while utilities are finite; a NaN
utility sorts last here).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from cl_lightning.nn.optim import AdamGnT
from cl_lightning.nn.optim.flat_adam import scalar_operand

ReplacementInit = Literal["kaiming", "default", "xavier", "lecun"]
UtilityType = Literal["contribution", "adaptable_contribution"]

# Bound b of U(−b, b) for a redrawn incoming row, from (fan_in, fan_out); ReLU gain √2 (``compute_bounds``).
_BOUNDS: dict[str, Callable[[int, int], float]] = {
    "kaiming": lambda fan_in, fan_out: math.sqrt(2) * math.sqrt(3 / fan_in),
    "default": lambda fan_in, fan_out: math.sqrt(1 / fan_in),
    "xavier": lambda fan_in, fan_out: math.sqrt(2) * math.sqrt(6 / (fan_in + fan_out)),
    "lecun": lambda fan_in, fan_out: math.sqrt(3 / fan_in),
}


def batch_mean(x: Tensor) -> Tensor:
    """``x.mean(0)``, bit for bit: ``(B, ...) -> (...)``. One row (a one-point step) on the CPU in float32 / float64
    is summed instead, at half the cost: there torch's mean is the sum divided by the count (``mean_out``), and a
    division by 1 is exact."""
    if x.shape[0] == 1 and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return x.sum(0)
    return x.mean(0)


def contribution(h: Tensor, h_hat: Tensor, out_mag: Tensor, in_mag: Tensor) -> Tensor:
    """``out_mag · mean_batch|h|`` per unit: ``h (B, H)``, the rest ``(H,)``."""
    return out_mag * batch_mean(h.abs())


def adaptable_contribution(h: Tensor, h_hat: Tensor, out_mag: Tensor, in_mag: Tensor) -> Tensor:
    """``out_mag · mean_batch|h − ĥ| / in_mag`` per unit: ``h (B, H)``, the rest ``(H,)``."""
    return out_mag * batch_mean(torch.sub(h, h_hat).abs_()) / in_mag


UTILITIES: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]] = {
    "contribution": contribution,
    "adaptable_contribution": adaptable_contribution,
}


@dataclass
class HostCounts:
    """Host copy of what a layer's replacement count depends on: eligible units, the ages of the others, the carry."""

    clock: int = 0  # steps tested
    eligible: int = 0  # units with age > maturity threshold
    young: deque[list[int]] = field(default_factory=deque)  # [clock at age 0, units], oldest first
    carried: float = 0.0  # to_replace_i

    def tick(self, threshold: int) -> int:
        """One step older (``age += 1``): the young units now past ``threshold`` become eligible."""
        self.clock += 1
        while self.young and self.clock - self.young[0][0] > threshold:
            self.eligible += self.young.popleft()[1]
        return self.eligible

    def replace(self, count: int) -> None:
        """``count`` eligible units restart at age 0."""
        self.eligible -= count
        self.young.append([self.clock, count])

    @classmethod
    def from_ages(cls, age: Tensor, threshold: int, carried: float) -> HostCounts:
        """Rebuild from a layer's ages (read once, on load)."""
        ages = Counter(age.tolist())
        young = deque([-a, n] for a, n in sorted(ages.items(), reverse=True) if a <= threshold)
        return cls(0, sum(n for a, n in ages.items() if a > threshold), young, carried)


class GenerateAndTest(nn.Module):
    """Utilities, ages and replacement of the hidden units of a stack of linear layers.

    Args:
        hidden_sizes: Widths of the hidden layers (layer ``i`` feeds layer ``i + 1``; the last feeds the output).
        replacement_rate: Fraction of eligible units replaced per step (QOA paper's PMNIST CBP: 1e-4).
        maturity_threshold: Units younger than or as old as this are never replaced (100).
        decay_rate: η of the running averages (0.99).
        utility: ``"contribution"`` or ``"adaptable_contribution"`` (reference MNIST/SCR default).
        accumulate: Carry the fractional replacement count over (the PMNIST reference hard-codes ``True``);
            ``False`` replaces one unit with probability ``n`` when ``n < 1``.
        init: Distribution bound of redrawn incoming weights (reference default ``"kaiming"``).
        next_bias_correction: Apply the next-layer bias correction the reference turns into a no-op (default
            ``False``, faithful).
    """

    def __init__(
        self,
        hidden_sizes: list[int],
        replacement_rate: float = 1e-4,
        maturity_threshold: int = 100,
        decay_rate: float = 0.99,
        utility: UtilityType = "adaptable_contribution",
        accumulate: bool = True,
        init: ReplacementInit = "kaiming",
        next_bias_correction: bool = False,
    ) -> None:
        super().__init__()
        if not hidden_sizes or min(hidden_sizes) < 1:
            raise ValueError(f"generate-and-test needs at least one hidden layer, got hidden_sizes={hidden_sizes}")
        if not 0 <= replacement_rate <= 1 or not 0 <= decay_rate < 1 or maturity_threshold < 0:
            raise ValueError("replacement_rate in [0, 1], decay_rate in [0, 1) and maturity_threshold >= 0 required")
        if utility not in UTILITIES or init not in _BOUNDS:
            raise ValueError(f"utility must be one of {list(UTILITIES)} and init one of {list(_BOUNDS)}")
        self.num_layers = len(hidden_sizes)
        self.replacement_rate, self.decay_rate = replacement_rate, decay_rate
        self.maturity_threshold = maturity_threshold
        self.utility, self.accumulate, self.init = utility, accumulate, init
        self.next_bias_correction = next_bias_correction
        for i, width in enumerate(hidden_sizes):
            for name in ("util", "bias_corrected_util", "mean_act"):
                self.register_buffer(f"{name}_{i}", torch.zeros(width))
            self.register_buffer(f"age_{i}", torch.zeros(width, dtype=torch.long))
            self.register_buffer(f"to_replace_{i}", torch.zeros((), dtype=torch.float64))
            self.register_buffer(f"replaced_{i}", torch.zeros((), dtype=torch.long))
        self._host = [HostCounts(young=deque([[0, width]])) for width in hidden_sizes]
        self._none: dict[torch.device, Tensor] = {}  # "no unit replaced" per device: one shared zero-size index
        self._constants: dict[tuple[torch.dtype, torch.device], tuple[Tensor | float, ...]] = {}  # η, 1, 1 (ages)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object, **kwargs: object) -> None:
        """Load the buffers, then rebuild the host counts from the ages and carried fractions (once per load)."""
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)  # type: ignore[arg-type]
        self.sync_host()

    def sync_host(self) -> None:
        """Rebuild the host counts from the ``age_i`` and ``to_replace_i`` buffers (after writing them by hand)."""
        threshold = self.maturity_threshold
        self._host = [
            HostCounts.from_ages(self.buffer("age", i).cpu(), threshold, float(self.buffer("to_replace", i)))
            for i in range(self.num_layers)
        ]

    def buffer(self, name: str, layer: int) -> Tensor:
        """The buffer ``name`` (``util``, ``age``, ...) of hidden layer ``layer``."""
        return self._buffers[f"{name}_{layer}"]  # not getattr: nn.Module's fallback lookup costs µs a step

    @torch.no_grad()
    def step(
        self,
        layers: Sequence[nn.Linear],
        features: Sequence[Tensor],
        optimizer: torch.optim.Optimizer | None,
        generator: torch.Generator,
    ) -> list[Tensor]:
        """Test every hidden layer, replace its weakest mature units; returns the replaced indices per layer.

        Args:
            layers: The ``num_layers + 1`` linear layers (hidden layers, then the output layer).
            features: Post-activation outputs ``(B, H_i)`` of each hidden layer, from the forward pass before the
                optimiser step.
            optimizer: The optimiser; its per-unit state is reset when it is an :class:`AdamGnT`.
            generator: CPU generator of the stochastic rounding and the redrawn weights.
        """
        assert len(layers) == self.num_layers + 1
        assert len(features) == self.num_layers
        if self.replacement_rate == 0:
            return [self._no_units(f.device) for f in features]
        mags = [layer.weight.abs() for layer in layers]  # once each: a layer's incoming and its feeder's outgoing
        h_hats = [self._test(i, mags[i], mags[i + 1], features[i]) for i in range(self.num_layers)]
        counts = self.next_counts(generator)
        self.store_carried()
        return self.replace(layers, counts, optimizer, generator, h_hats)

    def next_counts(self, generator: torch.Generator | None) -> list[int]:
        """One step of the host counts: how many units each layer replaces (:meth:`replace` chooses them). Host
        arithmetic only, so the native kernel runs it ahead of the tests (``generator``: only if not ``accumulate``)."""
        counts = []
        for i, host in enumerate(self._host):
            eligible = host.tick(self.maturity_threshold)
            count = min(self._count(i, eligible, generator), eligible)
            if count:
                host.replace(count)
            counts.append(count)
        return counts

    def store_carried(self) -> None:
        """Write the host's carried fractions into the ``to_replace_i`` buffers (what checkpoints keep)."""
        for i, host in enumerate(self._host):
            self.buffer("to_replace", i).fill_(host.carried)

    @torch.no_grad()
    def replace(
        self,
        layers: Sequence[nn.Linear],
        counts: list[int],
        optimizer: torch.optim.Optimizer | None,
        generator: torch.Generator,
        h_hats: list[Tensor] | None = None,
    ) -> list[Tensor]:
        """After every layer's test, replace the ``counts[i]`` (:meth:`next_counts`) eligible units of lowest
        ``bias_corrected_util_i`` of each layer ``i``; the replaced indices per layer. ``h_hats``: each layer's ĥ from
        the test (``None``: from the buffers)."""
        if h_hats is None and self.next_bias_correction:  # tested in C (the native kernel): ĥ from the buffers
            h_hats = [self.buffer("mean_act", i) / self._bias_correction(i) for i in range(self.num_layers)]
        replaced = []
        for i, count in enumerate(counts):
            if count == 0:  # known on the host: no device read
                replaced.append(self._no_units(layers[i].weight.device))
                continue
            index = self._choose(i, count)
            self._generate(i, layers[i], layers[i + 1], index, h_hats[i] if h_hats else None, generator)
            if isinstance(optimizer, AdamGnT):
                optimizer.reset_state(layers[i].weight, index, 0)
                optimizer.reset_state(layers[i].bias, index, 0)
                optimizer.reset_state(layers[i + 1].weight, index, 1)
            replaced.append(index)
        return replaced

    def _no_units(self, device: torch.device) -> Tensor:
        """The zero-size index of "no unit replaced" on ``device`` (made once, shared: read it only)."""
        if device not in self._none:
            self._none[device] = torch.zeros(0, dtype=torch.long, device=device)
        return self._none[device]

    def _operands(self, util: Tensor, age: Tensor) -> tuple[Tensor | float, ...]:
        """η and 1 as operands on ``util``, 1 on ``age`` (:func:`~cl_lightning.nn.optim.flat_adam.scalar_operand`)."""
        key = (util.dtype, util.device)
        if key not in self._constants:
            eta, one = (scalar_operand(c, util) for c in (self.decay_rate, 1.0))
            self._constants[key] = (eta, one, scalar_operand(1, age))
        return self._constants[key]

    def _bias_correction(self, i: int) -> Tensor:
        """``1 − η^age`` of layer ``i``'s units ``(H,)``: Adam-style bias correction of the running averages."""
        age, util = self.buffer("age", i), self.buffer("util", i)
        op_eta, one, _ = self._operands(util, age)
        return torch.sub(one, torch.pow(op_eta, age.to(util.dtype)))

    def _test(self, i: int, weight_abs: Tensor, consumer_abs: Tensor, h: Tensor) -> Tensor:
        """Update the ages and utilities of layer ``i`` (``test_features``) from its features ``h``, ``|W_i|`` and
        ``|W_{i+1}|`` (the weights it reads with and is read with); ĥ."""
        eta = self.decay_rate
        age, util, mean_act = self.buffer("age", i), self.buffer("util", i), self.buffer("mean_act", i)
        op_eta, _, age_one = self._operands(util, age)
        age.add_(age_one)
        bc = self._bias_correction(i)  # (H,)
        util.mul_(op_eta)
        mean_act.mul_(op_eta).add_(batch_mean(h).to(util.dtype), alpha=1 - eta)
        h_hat = mean_act / bc
        out_mag = batch_mean(consumer_abs)  # (H,) mean over the units this one feeds
        in_mag = weight_abs.mean(1)  # (H,) mean over this unit's inputs
        util.add_(UTILITIES[self.utility](h.to(util.dtype), h_hat, out_mag, in_mag), alpha=1 - eta)
        torch.div(util, bc, out=self.buffer("bias_corrected_util", i))
        return h_hat

    def _choose(self, i: int, count: int) -> Tensor:
        """The ``count`` eligible units of layer ``i`` of lowest ``bias_corrected_util``, ascending; their utility
        and mean activation zeroed."""
        eligible = self.buffer("age", i) > self.maturity_threshold
        by_util = self.buffer("bias_corrected_util", i).argsort(stable=True)  # lowest first, ties to the lower index
        order = by_util[(~eligible[by_util]).to(torch.int8).argsort(stable=True)]  # the eligible units first
        index = order[:count].sort().values
        self.buffer("util", i)[index] = 0
        self.buffer("mean_act", i)[index] = 0
        return index

    def _count(self, i: int, eligible: int, gen: torch.Generator | None) -> int:
        """How many units of layer ``i`` to replace this step, from ``eligible`` units (host arithmetic, float64 as
        the reference's Python floats; :meth:`store_carried` keeps the carried fraction for checkpoints)."""
        host = self._host[i]
        expected = self.replacement_rate * eligible
        host.carried += expected  # the reference accumulates in both modes
        if not self.accumulate:
            draw = float(torch.rand((), generator=gen, dtype=torch.float64))  # the CPU generator: a host value
            return int(draw <= expected and eligible > 0) if expected < 1 else math.floor(expected)
        count = math.floor(host.carried)
        host.carried -= count
        return count

    def _generate(
        self, i: int, layer: nn.Linear, consumer: nn.Linear, index: Tensor, h_hat: Tensor | None, gen: torch.Generator
    ) -> None:
        """Redraw incoming weights, zero incoming bias and outgoing weights, reset ages (``gen_new_features``)."""
        bound = _BOUNDS[self.init](layer.in_features, layer.out_features)
        fresh = torch.empty(index.numel(), layer.in_features).uniform_(-bound, bound, generator=gen)
        layer.weight[index] = fresh.to(layer.weight.device, layer.weight.dtype, non_blocking=True)
        layer.bias[index] = 0
        if self.next_bias_correction:  # the reference's line, with ĥ read before the reset zeroed it
            consumer.bias.add_((consumer.weight[:, index] * h_hat[index].to(consumer.weight)).sum(1))
        consumer.weight[:, index] = 0
        self.buffer("age", i)[index] = 0
        self.buffer("replaced", i).add_(index.numel())
