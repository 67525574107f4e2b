"""Continual Backprop: Backprop plus generate-and-test (Dohare et al. 2024, "Loss of plasticity in deep continual
learning"; the CBP baseline of Bekal et al. 2025, which reuses the authors' ``lop/algos/cbp.py`` verbatim).

Per chunk, as ``ContinualBackprop.learn`` of the reference (docs/baselines.md §2): forward pass keeping
the post-ReLU features of every hidden layer, one optimiser step on the chunk's loss, then one generate-and-test
step (:class:`~cl_lightning.nn.gnt.GenerateAndTest`) on those features, which replaces the lowest-utility mature
units and resets their AdamGnT state (SGD's it leaves alone, as the reference; any other optimiser is refused).
Generate-and-test acts on the MLP head; with the CNN encoder the convolutional layers are trained but never
replaced (the reference's ConvGnT is a different algorithm).

DDP: the ranks' features are all-gathered before generate-and-test, so every rank tests the whole chunk (in rank
order) and replaces the same units with the same ``(seed, step)`` draws: the ranks' weights stay equal.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor

from cl_lightning.contract import StreamBatch, StreamSteps
from cl_lightning.learners.backprop import Backprop
from cl_lightning.learners.engines import FastSteps, StepRun
from cl_lightning.nn.gnt import GenerateAndTest, ReplacementInit, UtilityType
from cl_lightning.nn.network_steps import GenerateAndTestSteps
from cl_lightning.nn.optim import AdamGnT, FlatAdamGnT


def adam_gnt_1e4(params: Any) -> AdamGnT:
    """AdamGnT with lr 1e-4, default betas and the corrected update rule (the QOA paper's CBP optimiser)."""
    return AdamGnT(params, lr=1e-4)


class ContinualBackprop(Backprop):
    """Backprop whose weakest mature hidden units are re-initialised after every step.

    Args:
        replacement_rate: Fraction of eligible units replaced per step (paper PMNIST: 1e-4).
        maturity_threshold: Minimum age, in steps, before a unit may be replaced (100).
        decay_rate: η of the utility and mean-activation running averages (0.99).
        utility: ``"adaptable_contribution"`` (reference MNIST default) or ``"contribution"``.
        accumulate: Carry fractional replacement counts over (``True`` in the PMNIST reference).
        replacement_init: Distribution of redrawn incoming weights (reference: ``"kaiming"``).
        next_bias_correction: Apply the next-layer bias correction the reference turns into a no-op (default: no).
        optimizer: Optimiser factory: :class:`~cl_lightning.nn.optim.AdamGnT` (default, lr 1e-4) or SGD.
        **kwargs: :class:`~cl_lightning.learners.backprop.Backprop`'s (paper PMNIST: ``hidden_sizes``
            [200, 200, 200, 200], Kaiming-uniform init), ``seed`` (of the redrawn weights) and ``step_kernel``
            (generate-and-test after each fused update; ``"native"`` replaces units in Python and needs
            ``accumulate=True``).
    """

    native_optimizer = FlatAdamGnT

    def __init__(
        self,
        *,
        replacement_rate: float = 1e-4,
        maturity_threshold: int = 100,
        decay_rate: float = 0.99,
        utility: UtilityType = "adaptable_contribution",
        accumulate: bool = True,
        replacement_init: ReplacementInit = "kaiming",
        next_bias_correction: bool = False,
        optimizer: OptimizerCallable = adam_gnt_1e4,
        **kwargs: Any,
    ) -> None:
        super().__init__(optimizer=optimizer, **kwargs)
        widths = [layer.out_features for layer in self.net.layers[:-1]]
        self.gnt = GenerateAndTest(
            widths,
            replacement_rate,
            maturity_threshold,
            decay_rate,
            utility,
            accumulate,
            replacement_init,
            next_bias_correction,
        )

    def predict_with_features(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Outputs and the post-ReLU features of every hidden layer (the same computation as ``MLP.forward``)."""
        h, features = self.encoder(x), []
        for layer in self.net.layers[:-1]:
            h = layer(h).relu()
            features.append(h)
        return self.net.layers[-1](h), features

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> Tensor:
        """One optimiser step on the chunk, then generate-and-test on its features (every rank's, under DDP)."""
        x, y, _ = batch
        pred, features = self.predict_with_features(x)
        loss = self.loss(pred, y)
        run.log_online(pred, y, loss)
        run.step(loss)
        features = [h.detach() for h in features]
        if self.trainer.world_size > 1:  # DDP: every rank tests the whole chunk
            features = [self.all_gather(h).flatten(0, 1) for h in features]  # (W, B, H) -> (W·B, H)
        self.gnt.step(list(self.net.layers), features, run.optimizer, self.step_generator())
        return loss

    def learn_fused(self, batch: StreamSteps, start: int, run: StepRun, steps: FastSteps) -> Tensor:
        """Chunks ``start..`` as :meth:`learn_chunk` learns them: the MLP's steps with generate-and-test after each
        update (:class:`~cl_lightning.nn.network_steps.GenerateAndTestSteps`); step ``t`` draws from the generator of
        step ``steps taken + t``."""
        xs, y = batch.x[start:].flatten(2), batch.y[start:]  # (T, B, D), labels (T, B) or targets (T, B, k)
        first = self._steps
        network = GenerateAndTestSteps(
            list(self.net.layers), xs, y, self.gnt, run.optimizer, lambda t: self.generator_at(first + t)
        )
        preds = steps(network)
        self.count_steps(xs.shape[0])  # the steps step_generator would have counted, at once
        return run.add_fused(preds, y, xs.shape[1])

    def native_refusal(self) -> str | None:
        """The C steps carry fractional replacement counts over (accumulate=False draws a random number at every
        step to round the count)."""
        return None if self.hparams.get("accumulate", True) else "needs accumulate=True"  # asked before self.gnt exists

    def on_train_epoch_end(self) -> None:
        """Log how many units have been replaced so far (all layers)."""
        super().on_train_epoch_end()
        total = sum(self.gnt.buffer("replaced", i) for i in range(self.gnt.num_layers))
        self.log("train/replaced_units", total.float())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Build the optimiser; refuse one whose per-unit state generate-and-test cannot reset."""
        optimizer = super().configure_optimizers()
        if not isinstance(optimizer, (AdamGnT, torch.optim.SGD)):
            raise ValueError(
                f"ContinualBackprop needs cl_lightning.nn.AdamGnT (its per-unit state is reset) or torch.optim.SGD "
                f"(nothing to reset, as the reference), got {type(optimizer).__name__}"
            )
        return optimizer
