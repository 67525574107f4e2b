"""Continual Backprop: Backprop plus generate-and-test (Dohare et al. 2024, "Loss of plasticity in deep continual
learning"; the CBP baseline of Bekal et al. 2025, which reuses the authors' ``lop/algos/cbp.py`` verbatim).

Per chunk, as ``ContinualBackprop.learn`` of the reference (docs/baselines.md §2): forward pass keeping
the post-ReLU features of every hidden layer, one optimiser step on the chunk's loss, then one generate-and-test
step (:class:`~cl_lightning.nn.gnt.GenerateAndTest`) on those features, which replaces the lowest-utility mature
units and resets their AdamGnT state. QOA paper, Permuted MNIST: the BP net 49 → 200×4 → 10, AdamGnT lr 1e-4,
``adaptable_contribution``, replacement rate 1e-4, maturity threshold 100, decay 0.99, accumulated replacement
counts (docs/baselines.md §2). Generate-and-test acts on the MLP head; with the CNN encoder the convolutional layers are
trained but never replaced (the reference's ConvGnT is a different algorithm).

Optimiser: ``optimizer`` stays a factory like every learner's (YAML ``class_path: cl_lightning.nn.AdamGnT`` with
``lr``/``betas``/``eps``/``update_rule``), default AdamGnT with lr 1e-4. Generate-and-test resets the state of an
AdamGnT and leaves SGD's alone (the reference's two options); any other optimiser, whose per-unit state would go
stale silently, is refused in ``configure_optimizers``.

One-point streams (slowly changing regression, ``StreamSteps`` batches): :meth:`learn_fused` computes
:meth:`learn_chunk`'s numbers bit for bit with hand-written gradients and AdamGnT over views of one flat tensor,
generate-and-test after each update as here (``tests/test_fused_steps.py``). ``step_kernel="native"`` runs those
steps and generate-and-test's test in C (:func:`~cl_lightning.nn.native.cbp_mse_steps`), to float32 rounding; the
rare replacements stay in Python, so the redrawn weights are the torch path's draws.

DDP: the ranks' features are all-gathered before generate-and-test, so every rank tests the whole chunk (its
examples in rank order, not arrival order) and replaces the same units with the same ``(seed, step)`` draws: the
ranks' weights stay equal (tested in ``tests/test_ddp.py``).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor

from cl_lightning.contract import StreamBatch, StreamSteps
from cl_lightning.learners import fused
from cl_lightning.learners.backprop import Backprop
from cl_lightning.nn import native
from cl_lightning.nn.adam_gnt import AdamGnT
from cl_lightning.nn.flat_adam import FlatAdamGnT, FlatOptimizer
from cl_lightning.nn.gnt import GenerateAndTest, ReplacementInit, UtilityType


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
        next_bias_correction: Apply the next-layer bias correction that the reference turns into a no-op
            (default ``False``, faithful).
        optimizer: Optimiser factory: :class:`~cl_lightning.nn.adam_gnt.AdamGnT` (default, lr 1e-4) or
            ``torch.optim.SGD``.
        **kwargs: :class:`~cl_lightning.learners.backprop.Backprop`'s (paper PMNIST: ``hidden_sizes``
            [200, 200, 200, 200], Kaiming-uniform init; generate-and-test acts on the MLP head only), ``seed``,
            the seed of the redrawn weights (draws depend on ``(seed, step)`` only), and ``step_kernel``:
            ``"native"`` runs the fused one-point steps with AdamGnT and generate-and-test's test in C
            (:func:`~cl_lightning.nn.native.cbp_mse_steps`: equal to the torch path to float32 rounding, the
            replacements and their draws in Python as there); it needs ``accumulate=True`` and, to apply,
            AdamGnT on float32 CPU parameters (else the torch fused steps run, with one warning).
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
        if self.step_kernel == "native" and not accumulate:
            raise ValueError(
                "ContinualBackprop's native step kernel needs accumulate=True (accumulate=False draws a random "
                "number at every step to round the replacement count): use step_kernel='torch'"
            )

    @classmethod
    def has_native_kernel(cls) -> bool:
        """Whether ``step_kernel="native"`` applies: this class's chunk step, taken in ``StreamSteps`` batches."""
        return cls.learns_steps() and cls.learn_chunk is ContinualBackprop.learn_chunk

    def predict_with_features(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Outputs and the post-ReLU features of every hidden layer (the same computation as ``MLP.forward``)."""
        h, features = self.encoder(x), []
        for layer in self.net.layers[:-1]:
            h = layer(h).relu()
            features.append(h)
        return self.net.layers[-1](h), features

    def training_step(self, batch: StreamBatch | StreamSteps, batch_idx: int) -> dict[str, Any] | Tensor | None:
        """Loss of the chunk (logged as the online metric); its features go to generate-and-test after the step.
        ``StreamSteps``: step and generate-and-test on each chunk in turn (:meth:`learn_steps`)."""
        if isinstance(batch, StreamSteps):
            return self.learn_steps(batch)
        loss, features = self._loss_and_features(batch)
        return {"loss": loss, "features": features}

    def _loss_and_features(self, batch: StreamBatch) -> tuple[Tensor, list[Tensor]]:
        x, y, _ = batch
        pred, features = self.predict_with_features(x)
        loss = self.loss(pred, y)
        self.log_online(pred, y, loss)
        return loss, [h.detach() for h in features]

    def learn_chunk(self, batch: StreamBatch) -> Tensor:
        """One optimiser step on the chunk, then generate-and-test on its features (``ContinualBackprop.learn``)."""
        optimizer = self._chunked.optimizer
        loss, features = self._loss_and_features(batch)
        self.plain_step(loss)
        self.gnt.step(list(self.net.layers), features, optimizer, self.step_generator())
        return loss

    def learn_fused(self, batch: StreamSteps, start: int) -> Tensor | None:
        """Chunks ``start..`` as :meth:`learn_chunk` learns them, by hand-written MLP gradients, one flat AdamGnT
        update and generate-and-test on the step's features after each update
        (:meth:`~cl_lightning.learners.backprop.Backprop.fused_mlp_steps`): regression on flat inputs."""
        if type(self).learn_chunk is not ContinualBackprop.learn_chunk:
            return fused.refuse(self)
        layers, optimizer, draws = list(self.net.layers), self._chunked.optimizer, itertools.count(self._steps)

        def generate_and_test(features: list[Tensor]) -> None:
            self.gnt.step(layers, features, optimizer, self.generator_at(next(draws)))

        loss = self.fused_mlp_steps(batch, start, generate_and_test)
        if loss is not None:  # the steps step_generator would have counted, at once
            self.count_steps(batch.x.shape[0] - start)
        return loss

    def native_steps(self, adam: FlatOptimizer, xs: Tensor, ys: Tensor) -> Tensor:
        """:meth:`learn_fused`'s steps in C, generate-and-test included (``step_kernel="native"``,
        :func:`~cl_lightning.nn.native.cbp_mse_steps`); step ``t`` of the chunk draws from the generator of step
        ``steps taken + t``, as the torch path."""
        first, optimizer = self._steps, self._chunked.optimizer

        def generator_at(t: int) -> torch.Generator:
            return self.generator_at(first + t)

        return native.cbp_mse_steps(list(self.net.layers), adam, self.gnt, xs, ys, optimizer, generator_at)

    def on_train_batch_end(self, outputs: dict[str, Any] | Tensor | None, batch: StreamBatch, batch_idx: int) -> None:
        """Generate-and-test after the optimiser step (``ContinualBackprop.learn``); ``learn_chunk`` did it already
        for a ``StreamSteps`` batch."""
        features = outputs.get("features") if isinstance(outputs, dict) else None
        if features is None:
            return
        optimizer = self.trainer.optimizers[0] if self.trainer.optimizers else None
        if self.trainer.world_size > 1:  # DDP: every rank tests the whole chunk, so all replace the same units
            features = [self.all_gather(h).flatten(0, 1) for h in features]  # (W, B, H) -> (W·B, H)
        self.gnt.step(list(self.net.layers), features, optimizer, self.step_generator())

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
