"""Backprop: plain online SGD/Adam on each incoming chunk, no memory (the BP baseline of Bekal et al. 2025,
after Dohare et al. 2024, "Loss of plasticity in deep continual learning").

Per chunk: logits = f_θ(x); θ ← θ − η ∇θ CE(logits, y). The paper's Permuted-MNIST net is 49 → 200×4 → 10 with
ReLU, Kaiming-uniform init (the code; the table says Xavier), Adam lr 1e-4, one step per 400-example chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from torch import Tensor, nn

from cl_lightning.contract import StreamBatch, StreamSteps
from cl_lightning.learners import fused
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.nn import fused_steps, native
from cl_lightning.nn.cnn import make_encoder
from cl_lightning.nn.flat_adam import FlatAdam, FlatOptimizer
from cl_lightning.nn.mlp import MLP, InitName


class Backprop(ContinualLearner):
    """A network trained by gradient descent on the stream, one step per chunk; ignores the evaluation context.

    The head of the MLP learners (EWC and Continual Backprop take these arguments through ``**kwargs``).

    Args:
        hidden_sizes: Hidden widths of the MLP head (paper: [200, 200, 200, 200] on Permuted MNIST, [128, 128]
            after the CNN on Split Tiny ImageNet, [40] on slowly changing regression).
        init: Weight initialisation (paper code: Kaiming-uniform, zero biases).
        encoder: ``"flatten"`` (inputs as vectors) or ``"cnn"`` (the paper's shared 3-layer CNN, 1,152 features).
        step_kernel: What runs the fused one-point regression steps: ``"torch"`` (hand-written gradients as torch
            operations, autograd's numbers bit for bit) or ``"native"`` (the same algorithm as one C loop per chunk,
            :mod:`cl_lightning.nn.native`: equal to float32 rounding per step, many times faster on slowly changing
            regression; needs a C compiler). Backprop and Continual Backprop (which has its own kernel); refused
            by subclasses that step otherwise (EWC).
        **kwargs: :class:`~cl_lightning.learners.base.ContinualLearner`'s: the linked shapes, ``optimizer``
            (paper: Adam, lr 1e-4) and ``seed`` (unused by Backprop itself).
    """

    native_optimizer: ClassVar[type[FlatOptimizer]] = FlatAdam  # the flat optimiser native_steps implements

    def __init__(
        self,
        *,
        hidden_sizes: list[int] | None = None,
        init: InitName = "kaiming",
        encoder: Literal["flatten", "cnn"] = "flatten",
        step_kernel: fused.StepKernel = "torch",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if step_kernel != "torch" and not self.has_native_kernel():
            raise ValueError(f"{type(self).__name__} has no native step kernel: use step_kernel='torch'")
        self.step_kernel = fused.check_step_kernel(step_kernel)
        hidden = [200, 200, 200, 200] if hidden_sizes is None else list(hidden_sizes)
        self.encoder, features = make_encoder(encoder, self.input_shape)
        self.net = MLP(features, self.num_outputs, hidden, init=init)

    @classmethod
    def has_native_kernel(cls) -> bool:
        """Whether ``step_kernel="native"`` applies: Backprop's own chunk step, taken in ``StreamSteps`` batches."""
        return cls.learns_steps() and cls.learn_chunk is Backprop.learn_chunk

    def predict(self, x: Tensor) -> Tensor:
        """Logits (classification) or values (regression) of a batch of inputs."""
        return self.net(self.encoder(x))

    def training_step(self, batch: StreamBatch | StreamSteps, batch_idx: int) -> Tensor | None:
        """One gradient step on the chunk (Lightning's, on the returned loss); its logits before the step are the
        online (prequential) prediction. ``StreamSteps``: the same step on each chunk in turn (:meth:`learn_steps`)."""
        if isinstance(batch, StreamSteps):
            return self.learn_steps(batch)
        return self.chunk_loss(batch)

    def chunk_loss(self, batch: StreamBatch) -> Tensor:
        """Predict the chunk, log the online metric and return the loss."""
        x, y, _ = batch
        pred = self.predict(x)
        loss = self.loss(pred, y)
        self.log_online(pred, y, loss)
        return loss

    def learn_chunk(self, batch: StreamBatch) -> Tensor:
        """:meth:`chunk_loss`, then one optimiser step on it."""
        loss = self.chunk_loss(batch)
        self.plain_step(loss)
        return loss

    def learn_fused(self, batch: StreamSteps, start: int) -> Tensor | None:
        """Chunks ``start..`` by hand-written MLP gradients and one fused Adam
        (:func:`~cl_lightning.nn.fused_steps.mlp_mse_steps`): regression on flat inputs, unless a subclass changed the
        chunk step (CBP has its own)."""
        if type(self).learn_chunk is not Backprop.learn_chunk:
            return fused.refuse(self)
        return self.fused_mlp_steps(batch, start)

    def fused_mlp_steps(
        self, batch: StreamSteps, start: int, after_step: Callable[[list[Tensor]], object] | None = None
    ) -> Tensor | None:
        """:meth:`learn_fused`'s steps, with ``after_step`` called on each step's hidden features after its update
        (:func:`~cl_lightning.nn.fused_steps.mlp_mse_steps`), or :meth:`native_steps` (which does what
        ``after_step`` does) with ``step_kernel="native"``; ``None`` where no fused step applies."""
        if not isinstance(self.encoder, nn.Flatten):
            return fused.refuse(self)
        adam = fused.fused_adam(self)
        if adam is None:
            return None
        x, y = batch.x[start:].flatten(2), batch.y[start:]  # (T, B, D), (T, B, k)
        if fused.uses_native(self, adam, self.native_optimizer):
            preds = self.native_steps(adam, x, y.to(x.dtype))
        else:
            preds = fused_steps.mlp_mse_steps(list(self.net.layers), adam, x, y.to(x.dtype), after_step)
        return fused.finish_fused(self, adam, preds, y, x.shape[1])

    def native_steps(self, adam: FlatOptimizer, xs: Tensor, ys: Tensor) -> Tensor:
        """:meth:`fused_mlp_steps`' steps in C (``step_kernel="native"``): ``xs (T, B, D)``, ``ys (T, B, k)``
        ``-> predictions (T, B, k)`` (:func:`~cl_lightning.nn.native.mlp_mse_steps`)."""
        return native.mlp_mse_steps(list(self.net.layers), adam, xs, ys)

    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """The network's predictions on the queries (Backprop has no use for the context)."""
        return self.predict(query_x)

    def output_layer(self) -> nn.Module:
        """The MLP's output layer."""
        return self.net.layers[-1]
