"""Slowly changing regression (Dohare et al. 2024's bit-flipping problem), as the QOA paper runs it.

Inputs are 20 bits in {0, 1}: the first 15 ("slow" / flipping bits) are held for a whole task and the last 5 are
fresh i.i.d. bits for every example. Targets come from one fixed random network (``FixLTUNet`` of the
loss-of-plasticity code, docs/protocol.md §4):

    h_k = 1[w_k · x + b_k > τ_k],   τ_k = β (m + 1) − S_k,   S_k = (m − Σ_i w_ki + b_k) / 2,
    y   = v · h + c,

with m = 20 inputs, 100 hidden linear-threshold units, β = 0.7 and every weight and bias (w, b, v, c) drawn
uniformly from {−1, +1}. ``S_k`` follows the reference code (including its ``+ b_k``), not the prose, so targets
match the reference bit for bit given the same weights. No noise is added.

A task is one block of ``train_size + query_size`` consecutive stream steps (paper: 9,000 trained one per chunk,
then 1,000 held out; the evaluation context is the last ``context_size`` training steps, paper: 100). Drift at each
task boundary: by default all 15 slow bits are redrawn uniformly (``prob.json`` of both codebases leaves ``flip_one``
unset, so False); ``drift: flip_one`` toggles exactly one random slow bit instead (Dohare's ``flip_one_prob.json``
variant, the one his Extended Data Fig. 2 describes). The authors' five warm-up tasks are the ``warmup_tasks``
option (docs/protocol.md §2).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from cl_lightning.data.stream import TaskData, TaskStream, task_generator

DriftName = Literal["redraw_all", "flip_one"]


def _plus_minus_one(shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """Uniform draws from {−1, +1} as float32 (the reference draws ``randint(0, 2) * 2 - 1``)."""
    return torch.randint(0, 2, shape, generator=generator).float() * 2 - 1


def ltu_thresholds(weight: Tensor, bias: Tensor, beta: float) -> Tensor:
    """Thresholds ``τ_k = β (m + 1) − (m − Σ_i w_ki + b_k) / 2`` of the target net's LTUs: ``(K, m), (K,) -> (K,)``."""
    m = weight.shape[1]
    return beta * (m + 1) - (m - weight.sum(1) + bias) / 2


def ltu_target(x: Tensor, weight: Tensor, bias: Tensor, out_weight: Tensor, out_bias: Tensor, beta: float) -> Tensor:
    """The fixed target network: ``(N, m) -> (N, 1)``.

    Args:
        x: Inputs ``(N, m)``.
        weight: First-layer weights ``(K, m)``.
        bias: First-layer biases ``(K,)``.
        out_weight: Output weights ``(1, K)``.
        out_bias: Output bias ``(1,)``.
        beta: LTU threshold parameter (0.7 in both papers' configs).
    """
    features = (x @ weight.T + bias > ltu_thresholds(weight, bias, beta)).to(x.dtype)  # (N, K)
    return features @ out_weight.T + out_bias  # (N, 1)


class SlowlyChangingRegression(TaskStream):
    """Slowly changing regression: 15 slow bits per task, 5 random bits per example, a fixed LTU target net.

    Args:
        num_tasks: Tasks in the stream (paper: 800).
        train_size: Training steps per task, streamed in arrival order (paper: 9,000).
        query_size: Held-out steps at the end of each task (paper: 1,000).
        chunk_size: Examples per training chunk (paper: 1, one update per example).
        num_inputs: Input bits m (20).
        num_slow_bits: Bits held for a whole task (15); the other ``num_inputs − num_slow_bits`` are i.i.d.
        num_features: LTUs in the target net (100 in both papers' ``prob.json``).
        beta: LTU threshold parameter β (0.7 in the configs; the class default of the reference is 0.75).
        drift: ``"redraw_all"`` (paper and reference default: all slow bits redrawn each task) or ``"flip_one"``
            (exactly one slow bit toggled each task).
        seed: Stream seed: the target net and task ``t``'s data depend on ``(seed, t)`` only.
        warmup_tasks: The first tasks, trained on all ``train_size + query_size`` points in arrival order and never
            evaluated (paper: 5, each on all 10,000 points; default 0).
        cache_tasks: Generated tasks kept in memory (LRU; 0.8 MB each at paper size). An evaluation reads the current
            task and the five before it (the backward lags), so 8 generates each task about once.
    """

    task_type = "regression"
    num_outputs = 1

    def __init__(
        self,
        num_tasks: int = 800,
        train_size: int = 9_000,
        query_size: int = 1_000,
        chunk_size: int = 1,
        num_inputs: int = 20,
        num_slow_bits: int = 15,
        num_features: int = 100,
        beta: float = 0.7,
        drift: DriftName = "redraw_all",
        seed: int = 0,
        warmup_tasks: int = 0,
        cache_tasks: int = 8,
    ) -> None:
        super().__init__(
            num_tasks, train_size, query_size, chunk_size, seed=seed, warmup_tasks=warmup_tasks, cache_tasks=cache_tasks
        )
        if not 0 <= num_slow_bits <= num_inputs or num_features < 1:
            raise ValueError(f"need 0 <= num_slow_bits <= num_inputs and num_features >= 1, got {num_slow_bits}")
        if drift not in ("redraw_all", "flip_one"):
            raise ValueError(f"drift must be 'redraw_all' or 'flip_one', got {drift!r}")
        self.input_shape = (num_inputs,)
        self.num_slow_bits, self.beta, self.drift = num_slow_bits, beta, drift
        gen = task_generator(seed, 0, salt=11)  # the target net: one per run, never redrawn
        self.weight = _plus_minus_one((num_features, num_inputs), gen)
        self.bias = _plus_minus_one((num_features,), gen)
        self.out_weight = _plus_minus_one((1, num_features), gen)
        self.out_bias = _plus_minus_one((1,), gen)
        self._slow: Tensor | None = None  # flip_one: every task's slow bits, built once on first use

    def target(self, x: Tensor) -> Tensor:
        """The target net's outputs ``(N, 1)`` for inputs ``(N, num_inputs)``."""
        return ltu_target(x, self.weight, self.bias, self.out_weight, self.out_bias, self.beta)

    def _fresh_bits(self, task: int) -> Tensor:
        return torch.randint(0, 2, (self.num_slow_bits,), generator=task_generator(self.seed, task, salt=12)).float()

    def slow_bits(self, task: int) -> Tensor:
        """The slow bits ``(num_slow_bits,)`` held during ``task``.

        ``redraw_all``: a fresh uniform draw per task. ``flip_one``: task 0's draw, then at each boundary the bit
        ``flipped_bit(t)`` toggles; built once for the whole stream (one tiny draw per task).
        """
        if self.drift == "redraw_all":
            return self._fresh_bits(task)
        if self._slow is None:
            flips = [self.flipped_bit(t) for t in range(1, self.num_tasks)]
            toggles = torch.zeros(self.num_tasks, self.num_slow_bits)
            toggles[torch.arange(1, self.num_tasks), torch.tensor(flips, dtype=torch.long)] = 1.0
            parity = toggles.cumsum(0) % 2  # (T, n_slow): how often each bit has toggled since task 0, mod 2
            self._slow = (self._fresh_bits(0) + parity) % 2
        return self._slow[task]

    def flipped_bit(self, task: int) -> int:
        """``flip_one``: index of the slow bit toggled at the start of ``task`` (>= 1)."""
        return int(torch.randint(0, self.num_slow_bits, (1,), generator=task_generator(self.seed, task, salt=13)))

    def generate(self, task: int) -> TaskData:
        """The task's block of steps: slow bits repeated, fresh random bits per step, targets from the fixed net."""
        n = self.train_size + self.query_size
        gen = task_generator(self.seed, task)
        fast = torch.randint(0, 2, (n, self.input_shape[0] - self.num_slow_bits), generator=gen)
        x = torch.cat([self.slow_bits(task).expand(n, -1), fast.float()], dim=1)  # (n, m)
        y = self.target(x)  # (n, 1)
        k = self.train_size
        return TaskData(x[:k], y[:k], x[k:], y[k:])

    def context(self, data: TaskData, context_size: int) -> tuple[Tensor, Tensor]:
        """The ``context_size`` steps just before the held-out block (paper: 100): the end of the training portion."""
        lo = max(0, self.train_size - context_size)
        return data.train_x[lo:], data.train_y[lo:]
