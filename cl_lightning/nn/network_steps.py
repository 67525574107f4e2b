"""A network's run of ``T`` predict-then-learn steps as one object with two implementations: :meth:`torch`, the
fused steps of :mod:`cl_lightning.nn.fused_steps` (autograd's numbers bit for bit), and :meth:`native`, the same
steps in C (:mod:`cl_lightning.nn.native`, to float32 rounding; regression only).

A learner says which network steps its chunks and on what (its ``learn_fused``); the step engine, chosen once,
says which implementation runs them (``learners/engines.py``): the learner never picks C or torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cl_lightning.nn import fused_steps, native
from cl_lightning.nn.gnt import GenerateAndTest
from cl_lightning.nn.optim import FlatOptimizer

__all__ = ["GenerateAndTestSteps", "MLPSteps", "NetworkSteps", "WindowAttentionSteps"]


class NetworkSteps:
    """``T`` steps of one network, each predicting its chunk before learning from it; both implementations return
    the predictions ``(T, B, k)`` and leave the parameters and ``adam``'s state where the steps put them."""

    def torch(self, adam: FlatOptimizer) -> Tensor:
        """The steps in torch on ``adam`` (a flat optimiser bound to the network's parameters)."""
        raise NotImplementedError

    def native(self, adam: FlatOptimizer) -> Tensor:
        """The steps in C on ``adam``."""
        raise NotImplementedError(f"{type(self).__name__} has no native steps")


@dataclass
class MLPSteps(NetworkSteps):
    """An :class:`~cl_lightning.nn.MLP`'s steps (``layers``: its linear layers, ReLU between them): ``xs (T, B, D)``,
    ``ys`` labels ``(T, B)`` (cross-entropy) or targets ``(T, B, k)`` (MSE; the only loss in C)."""

    layers: list[nn.Linear]
    xs: Tensor
    ys: Tensor

    def torch(self, adam: FlatOptimizer) -> Tensor:
        return fused_steps.mlp_steps(self.layers, adam, self.xs, self.ys)

    def native(self, adam: FlatOptimizer) -> Tensor:
        return native.mlp_mse_steps(self.layers, adam, self.xs, self.ys)


@dataclass
class GenerateAndTestSteps(MLPSteps):
    """:class:`MLPSteps` with Continual Backprop's generate-and-test after each update: ``gnt`` tests every hidden
    layer on the step's features and replaces units, resetting their state in ``optimizer``; step ``t`` of the run
    draws from ``generator_at(t)``."""

    gnt: GenerateAndTest
    optimizer: torch.optim.Optimizer
    generator_at: Callable[[int], torch.Generator]

    def torch(self, adam: FlatOptimizer) -> Tensor:
        draws = itertools.count()

        def generate_and_test(features: list[Tensor]) -> None:
            self.gnt.step(self.layers, features, self.optimizer, self.generator_at(next(draws)))

        return fused_steps.mlp_steps(self.layers, adam, self.xs, self.ys, generate_and_test)

    def native(self, adam: FlatOptimizer) -> Tensor:
        return native.cbp_mse_steps(self.layers, adam, self.gnt, self.xs, self.ys, self.optimizer, self.generator_at)


@dataclass
class WindowAttentionSteps(NetworkSteps):
    """Label-free query-only attention's steps along a window of the stream: point ``S + t`` of ``window_x (S + T,
    D)`` / ``window_y (S + T, k)`` is step ``t``'s query, the ``S = support_size`` points before it its supports.
    ``first``: the :class:`~cl_lightning.nn.PairScorer`'s first layer, ``layers`` the ones after it."""

    first: nn.Linear
    layers: list[nn.Linear]
    window_x: Tensor
    window_y: Tensor
    support_size: int

    def torch(self, adam: FlatOptimizer) -> Tensor:
        return fused_steps.attention_mse_steps(
            self.first, self.layers, adam, self.window_x, self.window_y, self.support_size
        )

    def native(self, adam: FlatOptimizer) -> Tensor:
        return native.attention_mse_steps(
            self.first, self.layers, adam, self.window_x, self.window_y, self.support_size
        )
