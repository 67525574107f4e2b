"""Step engines: what runs a training batch's predict-then-learn steps, chosen once per learner (``step_kernel``;
docs/architecture.md, "Step engines": what each refuses, and when).

A learner states its step once, ``learn_chunk(batch, run)``; its engine runs a batch's ``K`` chunks in arrival order,
in manual optimisation: :class:`AutogradEngine` through Lightning's optimiser, :class:`FusedEngine` through the
network steps the learner's ``learn_fused`` names (:mod:`cl_lightning.nn.network_steps`) in torch (bit for bit),
:class:`NativeEngine` through the same network steps in C (to float32 rounding): the engine picks the implementation;
``"auto"`` (:class:`AutoEngine`) takes the fused steps where the run allows them, else autograd: the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from cl_lightning import lightning_compat
from cl_lightning.contract import StreamBatch, StreamSteps
from cl_lightning.learners.task_mean import Terms
from cl_lightning.nn import native
from cl_lightning.nn.fused_steps import has_forward_hooks
from cl_lightning.nn.network_steps import NetworkSteps
from cl_lightning.nn.optim import FlatAdamGnT, FlatOptimizer, adam_refusal, flat_optimizer_type

__all__ = [
    "AutoEngine",
    "AutogradEngine",
    "FastSteps",
    "FusedEngine",
    "NativeEngine",
    "StepKernel",
    "StepRun",
    "SteppedLearner",
    "check_steps",
    "step_engine",
]

StepKernel = Literal["auto", "autograd", "fused", "native", "torch"]
"""The engines by name; ``"torch"``, the name before engines, is ``"autograd"`` (the same numbers bit for bit)."""
FULL_PRECISION = ("32-true", "64-true", "32", "64")  # trainer.precision values the fused engines run under


class SteppedLearner(Protocol):
    """What an engine uses of a ``ContinualLearner`` (the base imports this module), besides the ``LightningModule``
    members (``trainer``, ``device``, ``optimizers``, ``manual_backward``, ``parameters``, ``modules``)."""

    task_type: str
    native_optimizer: type[FlatOptimizer]

    def learns_steps(self) -> bool: ...
    def has_fused_steps(self) -> bool: ...
    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> Tensor | None: ...
    def learn_fused(self, batch: StreamSteps, start: int, run: StepRun, steps: FastSteps) -> Tensor: ...
    def fused_ready(self, batch: StreamSteps, start: int) -> bool: ...
    def fused_refusal(self, chunk_size: int | None = None) -> str | None: ...
    def native_refusal(self) -> str | None: ...
    def add_task_terms(self, terms: Terms, online: list[tuple[Tensor, Tensor]]) -> None: ...
    def loss(self, pred: Tensor, y: Tensor) -> Tensor: ...


class StepRun:
    """The bookkeeping of one training batch's steps, handed to the learner's ``learn_chunk`` and ``learn_fused``.

    Attributes:
        terms: The task-mean terms of :meth:`log_task_mean`, added once per batch.
        online: The online predictions of :meth:`log_online` and their targets, scored once per batch.
        counted: Optimiser steps taken outside Lightning's wrapper (fused steps), added to ``global_step``.
    """

    def __init__(self, learner: SteppedLearner) -> None:
        self.learner = learner
        self.terms: Terms = {}
        self.online: list[tuple[Tensor, Tensor]] = []
        self.counted = 0

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The trainer's optimiser, unwrapped (Lightning's stand-in when nothing is trained, kNN)."""
        return self.learner.trainer.optimizers[0]

    def log_online(self, pred: Tensor, y: Tensor, loss: Tensor | None = None) -> None:
        """The prequential metric of predictions made *before* learning from ``y`` (and ``loss`` as ``train/loss``)."""
        if pred.shape[0] == 0:
            return
        self.online.append((pred.detach(), y))
        if loss is not None:
            self.log_task_mean("train/loss", loss, pred.shape[0])

    def log_task_mean(self, name: str, value: Tensor, weight: int = 1) -> None:
        """Hold back a batch mean ``value`` of ``weight`` examples for the task mean of ``name``."""
        values, weights = self.terms.setdefault(name, ([], []))
        values.append(value.detach())
        weights.append(weight)

    def step(self, loss: Tensor) -> None:
        """One optimiser step on ``loss`` through Lightning's manual optimisation (its precision plugin, DDP's
        gradient reduction and its step count apply)."""
        optimizer = self.learner.optimizers()
        optimizer.zero_grad()
        self.learner.manual_backward(loss)
        optimizer.step()

    def add_fused(self, preds: Tensor, y: Tensor, weight: int) -> Tensor:
        """Book ``T`` fused steps as ``learn_chunk`` would have: the online predictions ``preds (T, B, k)`` of targets
        ``y`` (``(T, B, k)``, or labels ``(T, B)``), each step's loss as a ``train/loss`` term of ``weight``
        examples, ``T`` optimiser steps; returns the summed losses."""
        steps = preds.shape[0]
        self.online.append((preds.flatten(0, 1), y.flatten(0, 1)))
        if self.learner.task_type == "classification":  # each step's cross-entropy, as learn_chunk computes it
            losses = torch.stack([self.learner.loss(p, t) for p, t in zip(preds, y, strict=True)])
        else:  # (T,): each step's MSE (the same bits as one step's, in one call)
            losses = (preds - y.to(preds.dtype)).pow(2).mean((1, 2))
        values, weights = self.terms.setdefault("train/loss", ([], []))
        values.append(losses)  # one 1-d entry for the run of steps (task_mean.add_terms)
        weights.extend([weight] * steps)
        self.counted += steps
        return losses.sum()


class FastSteps:
    """What a learner's ``learn_fused`` runs its network's steps through: ``steps(network_steps)`` runs them in the
    implementation the engine chose (torch or C) on ``adam``, the batch's flat optimiser, and returns the
    predictions."""

    def __init__(self, adam: FlatOptimizer, implementation: Callable[[NetworkSteps, FlatOptimizer], Tensor]) -> None:
        self.adam = adam
        self._implementation = implementation

    def __call__(self, network_steps: NetworkSteps) -> Tensor:
        return self._implementation(network_steps, self.adam)


class AutogradEngine:
    """Each chunk through the learner's ``learn_chunk``, stepped by autograd."""

    name = "autograd"

    def check_learner(self, learner: SteppedLearner) -> None:
        """Refuse, at construction, a learner this engine cannot run (none here)."""

    def for_run(self, learner: SteppedLearner) -> AutogradEngine:
        """The engine that serves this run, when training starts: this one, or a one-line refusal (none here)."""
        return self

    def learn(self, learner: SteppedLearner, batch: StreamBatch | StreamSteps) -> Tensor | None:
        """The batch's chunks in arrival order, each predicted, then learned, before the next is seen; the task-mean
        terms added once; the summed losses."""
        steps = batch if isinstance(batch, StreamSteps) else StreamSteps(*(t[None] for t in batch))
        run, losses = StepRun(learner), []
        for i in range(steps.x.shape[0]):  # a loop over time: each chunk is learned before the next is predicted
            fused = self.learn_rest(learner, steps, i, run)
            if fused is not None:  # chunks i.. were learned by the fused step
                losses.append(fused)
                break
            loss = learner.learn_chunk(StreamBatch(steps.x[i], steps.y[i], steps.task_id[i]), run)
            if loss is not None:
                losses.append(loss.detach())
        learner.add_task_terms(run.terms, run.online)
        # global_step: the steps taken by hand; with nothing to train (kNN) every chunk, as Lightning's loop counts
        counted = run.counted if any(p.requires_grad for p in learner.parameters()) else steps.x.shape[0]
        if counted:
            lightning_compat.count_optimizer_steps(learner, counted)
        lightning_compat.count_logged_chunks(learner, steps.x.shape[0] - 1)  # the logging step counts chunks
        return torch.stack(losses).sum() if losses else None

    def learn_rest(self, learner: SteppedLearner, batch: StreamSteps, start: int, run: StepRun) -> Tensor | None:
        """Learn chunks ``start..`` at once and return their summed loss, or ``None`` for ``learn_chunk`` to learn
        chunk ``start`` (always, here)."""
        return None


class FusedEngine(AutogradEngine):
    """The learner's fused steps in torch, autograd's numbers bit for bit."""

    name = "fused"

    def __init__(self) -> None:
        self._flat: FlatOptimizer | None = None  # the optimiser on flat tensors: not module state, rebuilt from it

    def check_learner(self, learner: SteppedLearner) -> None:
        """Refuse a learner without fused steps of its own chunk step, or with settings they do not compute."""
        if not learner.has_fused_steps():
            raise ValueError(f"{type(learner).__name__} has no {self.name} step engine: use step_kernel: autograd")
        self._refuse(learner, learner.fused_refusal())

    def for_run(self, learner: SteppedLearner) -> AutogradEngine:
        """This engine, or the refusal of a run the fused step would not compute as autograd (:meth:`run_refusal`)."""
        self._refuse(learner, self.run_refusal(learner))
        return self

    def _refuse(self, learner: SteppedLearner, reason: str | None) -> None:
        """Raise the one-line refusal of ``reason`` (none for ``None``)."""
        if reason is None:
            return
        raise ValueError(f"{type(learner).__name__}'s step_kernel {self.name!r} {reason}: use step_kernel: autograd")

    def run_refusal(self, learner: SteppedLearner) -> str | None:
        """Why this run cannot take the fused steps (``None`` when it can)."""
        trainer, params = learner.trainer, list(learner.parameters())
        chunk_size = getattr(getattr(trainer.datamodule, "stream", None), "chunk_size", None)
        if learner.device.type != "cpu":  # bit-exactness is tested on the CPU only
            return f"runs on the CPU only, not {learner.device.type}"
        if str(trainer.precision) not in FULL_PRECISION:
            return f"computes in full precision only, not trainer.precision {trainer.precision!r}"
        if trainer.world_size > 1:
            return "runs in one process only (it reduces no gradients)"
        if has_forward_hooks(learner.modules()):
            return "would not call a module's forward hook (one is registered, a monitor's?)"
        reason = adam_refusal(learner.trainer.optimizers[0] if trainer.optimizers else None, params)
        return learner.fused_refusal(chunk_size) if reason is None else f"cannot reproduce {reason}"

    def learn_rest(self, learner: SteppedLearner, batch: StreamSteps, start: int, run: StepRun) -> Tensor | None:
        """Chunks ``start..`` through the learner's fused steps once they apply (``fused_ready``)."""
        if not learner.fused_ready(batch, start):
            return None
        flat_type = flat_optimizer_type(run.optimizer)
        if type(self._flat) is not flat_type:
            self._flat = flat_type()
        adam = self._flat.bind(run.optimizer, list(learner.parameters()))
        loss = learner.learn_fused(batch, start, run, FastSteps(adam, self.run_steps))
        adam.release()
        return loss

    @staticmethod
    def run_steps(network_steps: NetworkSteps, adam: FlatOptimizer) -> Tensor:
        """The network's steps in torch."""
        return network_steps.torch(adam)


class NativeEngine(FusedEngine):
    """The fused steps' chunk in C, equal to autograd to float32 rounding per step."""

    name = "native"

    def check_learner(self, learner: SteppedLearner) -> None:
        """As the fused engine, on regression only (the C steps compute MSE) and the learner's settings its C steps
        compute (``native_refusal``), once the C kernels build."""
        super().check_learner(learner)
        self._refuse(learner, "fits regression only" if learner.task_type != "regression" else None)
        self._refuse(learner, learner.native_refusal())
        native.library()

    @staticmethod
    def run_steps(network_steps: NetworkSteps, adam: FlatOptimizer) -> Tensor:
        """The network's steps in C."""
        return network_steps.native(adam)

    def run_refusal(self, learner: SteppedLearner) -> str | None:
        """As the fused engine, and the kernel implements the optimiser (the learner's :attr:`native_optimizer`) on
        float32 parameters."""
        reason = super().run_refusal(learner)
        if reason is not None:
            return reason
        optimizer = learner.trainer.optimizers[0]
        if flat_optimizer_type(optimizer) is not learner.native_optimizer:
            wanted = "AdamGnT" if learner.native_optimizer is FlatAdamGnT else "Adam / AdamW"
            return f"implements {wanted}, not {type(optimizer).__name__}"
        if any(p.dtype != torch.float32 for p in learner.parameters()):
            return "computes in float32 only"
        return None


class AutoEngine(FusedEngine):
    """A fused engine where the run allows it, else autograd (the same numbers), chosen when training starts."""

    name = "auto"

    def for_run(self, learner: SteppedLearner) -> AutogradEngine:
        """A fused engine, or autograd for a run the fused steps would refuse (an accelerator, a forward hook, ...)."""
        return FusedEngine() if self.run_refusal(learner) is None else AutogradEngine()


def step_engine(step_kernel: StepKernel, learner: SteppedLearner) -> AutogradEngine | None:
    """The engine ``step_kernel`` names for ``learner``, checked (:meth:`AutogradEngine.check_learner`); ``None``
    for a learner that steps in its own ``training_step`` (EWC), which only ``"autograd"`` describes."""
    engines = {"autograd": AutogradEngine, "torch": AutogradEngine, "fused": FusedEngine, "native": NativeEngine}
    if step_kernel == "auto":  # the fused steps only where they compute this learner's settings
        fits = learner.has_fused_steps() and learner.fused_refusal() is None
        engines["auto"] = AutoEngine if fits else AutogradEngine
    if step_kernel not in engines:
        raise ValueError(f"step_kernel must be 'auto', 'autograd', 'fused' or 'native', not {step_kernel!r}")
    engine = engines[step_kernel]()
    engine.check_learner(learner)
    return engine if learner.learns_steps() else None


def check_steps(learner: SteppedLearner, data: Any, world_size: int) -> None:
    """Refuse, when the fit starts, ``StreamSteps`` batches (``data.steps_per_batch`` > 1 in one process) the run
    cannot learn: a learner without a step engine (``TypeError``) or chunks that do not divide every task's training
    portion (``ValueError``)."""
    if getattr(data, "chunks_per_batch", lambda _: 1)(world_size) == 1:
        return
    if not learner.learns_steps():
        raise TypeError(f"{type(learner).__name__} learns one chunk per training batch: set data.steps_per_batch: 1")
    stream = data.stream
    sizes = {stream.task_train_size(t) for t in {0, stream.warmup_tasks}}
    if any(n % stream.chunk_size for n in sizes):
        raise ValueError(
            f"steps_per_batch > 1 needs chunk_size {stream.chunk_size} to divide every task's training "
            f"portion ({sorted(sizes)} examples)"
        )
