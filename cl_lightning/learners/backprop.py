"""Backprop: plain online SGD/Adam on each incoming chunk, no memory (the BP baseline of Bekal et al. 2025,
after Dohare et al. 2024, "Loss of plasticity in deep continual learning").

Per chunk: logits = f_θ(x); θ ← θ − η ∇θ CE(logits, y). The paper's Permuted-MNIST net is 49 → 200×4 → 10 with
ReLU, Kaiming-uniform init (the code; the table says Xavier), Adam lr 1e-4, one step per 400-example chunk.
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor, nn

from cl_lightning.contract import StreamBatch, StreamSteps
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.learners.engines import FastSteps, StepKernel, StepRun, step_engine
from cl_lightning.nn.cnn import make_encoder
from cl_lightning.nn.mlp import MLP, InitName
from cl_lightning.nn.network_steps import MLPSteps


class Backprop(ContinualLearner):
    """A network trained by gradient descent on the stream, one step per chunk; ignores the evaluation context.

    Args:
        hidden_sizes: Hidden widths of the MLP head (paper: [200, 200, 200, 200] on Permuted MNIST, [128, 128]
            after the CNN on Split Tiny ImageNet, [40] on slowly changing regression).
        init: Weight initialisation (paper code: Kaiming-uniform, zero biases).
        encoder: ``"flatten"`` (inputs as vectors) or ``"cnn"`` (the paper's shared 3-layer CNN, 1,152 features).
        step_kernel: The step engine, chosen once: ``"autograd"`` (default; ``"torch"`` is the same), ``"fused"``
            (hand-written MLP gradients and one flat Adam: autograd's numbers bit for bit), ``"auto"`` (``fused``
            where the run allows it, else ``autograd``, decided when training starts) or ``"native"`` (the fused
            steps in C, regression only, to float32 rounding; needs a C compiler). ``fused`` and ``native`` need
            flat inputs, the CPU, full precision, Adam / AdamW (CBP: AdamGnT) and no forward hook; anything else is
            refused before the first batch. EWC: ``"autograd"`` only.
        **kwargs: :class:`~cl_lightning.learners.base.ContinualLearner`'s: the linked shapes, ``optimizer``
            (paper: Adam, lr 1e-4) and ``seed`` (unused by Backprop itself).
    """

    def __init__(
        self,
        *,
        hidden_sizes: list[int] | None = None,
        init: InitName = "kaiming",
        encoder: Literal["flatten", "cnn"] = "flatten",
        step_kernel: StepKernel = "autograd",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        hidden = [200, 200, 200, 200] if hidden_sizes is None else list(hidden_sizes)
        self.encoder, features = make_encoder(encoder, self.input_shape)
        self.net = MLP(features, self.num_outputs, hidden, init=init)
        self.step_kernel = step_kernel
        self.engine = step_engine(step_kernel, self)

    def predict(self, x: Tensor) -> Tensor:
        """Logits (classification) or values (regression) of a batch of inputs."""
        return self.net(self.encoder(x))

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> Tensor:
        """Predict the chunk, log the online metric, then one optimiser step on its loss."""
        x, y, _ = batch
        pred = self.predict(x)
        loss = self.loss(pred, y)
        run.log_online(pred, y, loss)
        run.step(loss)
        return loss

    def fused_refusal(self, chunk_size: int | None = None) -> str | None:
        """The fused steps take flat inputs."""
        return None if isinstance(self.encoder, nn.Flatten) else "needs encoder: flatten"

    def learn_fused(self, batch: StreamSteps, start: int, run: StepRun, steps: FastSteps) -> Tensor:
        """Chunks ``start..`` as the MLP's steps (:class:`~cl_lightning.nn.network_steps.MLPSteps`)."""
        x, y = batch.x[start:].flatten(2), batch.y[start:]  # (T, B, D), labels (T, B) or targets (T, B, k)
        preds = steps(MLPSteps(list(self.net.layers), x, y))
        return run.add_fused(preds, y, x.shape[1])

    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """The network's predictions on the queries (Backprop has no use for the context)."""
        return self.predict(query_x)

    def output_layer(self) -> nn.Module:
        """The MLP's output layer."""
        return self.net.layers[-1]
