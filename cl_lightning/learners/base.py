"""The base class of every learner: shapes, optimiser factory, online metric and episode evaluation
(docs/protocol.md); what callbacks may call on it is :class:`cl_lightning.contract.ObservedLearner`."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from cl_lightning import lightning_compat
from cl_lightning.contract import EvalBatch, StreamBatch, StreamSteps, TaskType, metric_key, online_key, summary_key
from cl_lightning.learners.engines import FastSteps, StepRun, check_steps, step_engine
from cl_lightning.learners.task_mean import TaskMean, Terms, add_terms, reduce_task_means, task_mean
from cl_lightning.memory.accounting import tensor_bytes
from cl_lightning.nn.optim import FlatAdam, FlatOptimizer, drop_unloadable_nvml_check

__all__ = ["ContinualLearner", "TaskMean", "TaskType", "adam_1e4"]


def adam_1e4(params: Any) -> torch.optim.Optimizer:
    """Adam with lr 1e-4 and PyTorch's default betas: the optimiser of every learner in the QOA paper."""
    return torch.optim.Adam(params, lr=1e-4)


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(cls.__init__).parameters)


def taken_arguments(cls: type, base: type) -> set[str]:
    """The keyword-only arguments of ``cls.__init__`` and, through ``**kwargs``, of its parents' ``__init__`` down to
    ``base``'s (the walk stops at the first ``__init__`` without ``**kwargs``): a class's config keys, as jsonargparse
    follows ``**kwargs``."""
    names: set[str] = set()
    for owner in cls.__mro__:
        if "__init__" in vars(owner):
            params = _parameters(owner)
            names |= {name for name, p in params.items() if p.kind is p.KEYWORD_ONLY}
            if owner is base or all(p.kind is not p.VAR_KEYWORD for p in params.values()):
                break
    return names


def _definer(cls: type, name: str) -> type:
    """The class along ``cls``'s MRO that defines ``name``."""
    return next(c for c in cls.__mro__ if name in c.__dict__)


def running_arguments(cls: type) -> set[str]:
    """Every argument of every ``__init__`` along ``cls``'s MRO: what ``save_hyperparameters`` finds on the frames."""
    return {name for owner in cls.__mro__ if "__init__" in vars(owner) for name in _parameters(owner)}


class ContinualLearner(LightningModule, ABC):
    """A learner on a task stream: one epoch is one task, one training batch is one chunk of the stream.

    Subclasses implement :meth:`learn_chunk` (run by the step engine) or :meth:`training_step` (predict the incoming
    chunk, :meth:`log_online`, then learn), and the abstract :meth:`predict_episode` and :meth:`output_layer`.

    Args:
        input_shape: Shape of one input (linked from the data module).
        num_outputs: Classes, or regression targets (linked from the data module).
        task_type: ``"classification"`` or ``"regression"`` (linked from the data module).
        optimizer: Optimiser factory called on the parameters (default: Adam, lr 1e-4, as the paper).
        seed: Seed of the learner's own sampling (support sets); draws depend on ``(seed, step)`` only.

    Subclasses pass their parents' (keyword-only) arguments on through ``**kwargs``; the hyperparameters are recorded
    here, once, for the arguments :meth:`arguments` lists.
    """

    fixed_arguments: ClassVar[tuple[str, ...]] = ()  # a parent's arguments the subclass sets itself (not config keys)
    native_optimizer: ClassVar[type[FlatOptimizer]] = FlatAdam  # the flat optimiser the learner's C kernel implements

    def __init__(
        self,
        *,
        input_shape: tuple[int, ...] = (49,),
        num_outputs: int = 10,
        task_type: TaskType = "classification",
        optimizer: OptimizerCallable = adam_1e4,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.num_outputs = num_outputs
        self.task_type = task_type
        self.optimizer_factory = optimizer
        self.seed = seed
        self.register_buffer("steps_taken", torch.zeros((), dtype=torch.long))  # counter for (seed, step) RNG
        self._steps = 0  # host shadow of steps_taken (the checkpointed tensor), reread on load
        self._task_means: dict[str, TaskMean] = {}  # name -> the running task's mean (not state: reset per task)
        # what runs a batch's steps (engines.py; Backprop and QOA choose it with step_kernel); None: training_step
        self.engine = step_engine("autograd", self)
        if self.engine is None and type(self).training_step is ContinualLearner.training_step:
            raise TypeError(f"{type(self).__name__} defines neither learn_chunk nor training_step")
        self.automatic_optimization = self.engine is None  # an engine steps the optimiser itself, in every batch
        # every running __init__'s arguments (Lightning reads them off the frames), less those the learner does not take
        self.save_hyperparameters(ignore=sorted(running_arguments(type(self)) - self.arguments()))

    @classmethod
    def arguments(cls) -> set[str]:
        """The learner's config keys and hyperparameters: :func:`taken_arguments` less the :attr:`fixed_arguments`."""
        return taken_arguments(cls, ContinualLearner) - set(cls.fixed_arguments)

    @property
    def metric_name(self) -> str:
        """``"acc"`` for classification, ``"mse"`` for regression."""
        return "acc" if self.task_type == "classification" else "mse"

    def step_generator(self) -> torch.Generator:
        """A CPU generator seeded from ``(seed, step)``; advances the step counter (kept in checkpoints, read from its
        host shadow: no step waits for the device)."""
        gen = self.generator_at(self._steps)
        self.count_steps(1)
        return gen

    def count_steps(self, n: int) -> None:
        """Count ``n`` steps as :meth:`step_generator` does, one at a time (a fused step counts its steps at once)."""
        self._steps += n
        self.steps_taken.add_(n)

    def generator_at(self, step: int) -> torch.Generator:
        """The generator :meth:`step_generator` gives at step ``step``, without counting a step."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + step)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        """Load this module's tensors, then reread the step counter's host shadow (once per load)."""
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._steps = int(self.steps_taken)

    def loss(self, pred: Tensor, y: Tensor) -> Tensor:
        """Cross-entropy on logits, or MSE on predictions (written out: the Hessian monitor's forward-over-reverse AD
        of ``F.mse_loss`` fails in torch 2.14, "ZeroTensors are immutable"; the same bits on CPU)."""
        if self.task_type == "classification":
            return nn.functional.cross_entropy(pred, y)
        return (pred - y.to(pred.dtype)).pow(2).mean()

    def score(self, pred: Tensor, y: Tensor) -> Tensor:
        """Accuracy (fraction correct) or MSE of a batch of predictions."""
        if self.task_type == "classification":
            return (pred.argmax(-1) == y).float().mean()
        return nn.functional.mse_loss(pred, y.to(pred.dtype))

    def log_online(self, pred: Tensor, y: Tensor, loss: Tensor | None = None) -> None:
        """Log the prequential metric of predictions made *before* learning from ``y`` (per-task mean)."""
        if pred.shape[0] == 0:
            return
        self.log_task_mean(online_key(self.metric_name), self.score(pred.detach(), y), pred.shape[0])
        if loss is not None:
            self.log_task_mean("train/loss", loss, pred.shape[0])

    def log_task_mean(self, name: str, value: Tensor, weight: int = 1) -> None:
        """Add a batch mean ``value`` of ``weight`` examples to the task mean of ``name``, logged at the task's end:
        ``self.log(name, value, on_step=False, on_epoch=True, batch_size=weight)`` without Lightning's per-call cost,
        averaged over every DDP rank's chunks."""
        task_mean(self._task_means, name, value.device).update(value, weight)

    @classmethod
    def learns_steps(cls) -> bool:
        """Whether a step engine runs the learner's batches: its :meth:`learn_chunk` is not an ancestor's below an
        overriding ``training_step`` (EWC's penalty)."""
        chunk = _definer(cls, "learn_chunk")
        return chunk is not ContinualLearner and issubclass(chunk, _definer(cls, "training_step"))

    @classmethod
    def has_fused_steps(cls) -> bool:
        """Whether the fused engines apply: one class defines both :meth:`learn_fused` and the chunk step it fuses."""
        chunk = _definer(cls, "learn_chunk")
        return cls.learns_steps() and _definer(cls, "learn_fused") is chunk is not ContinualLearner

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> Tensor | None:
        """Predict one chunk (``run.log_online``), then learn from it through ``run.step``; the loss, or ``None``
        when no step was taken. What a step engine runs per chunk."""
        raise NotImplementedError(f"{type(self).__name__} has no learn_chunk: set data.steps_per_batch: 1")

    def learn_fused(self, batch: StreamSteps, start: int, run: StepRun, steps: FastSteps) -> Tensor:
        """Learn chunks ``start..`` with :meth:`learn_chunk`'s numbers by naming the network steps that compute them
        (:mod:`cl_lightning.nn.network_steps`) and running them through ``steps`` (the engine's implementation, torch
        or C, on the batch's flat optimiser ``steps.adam``), booked in ``run`` as :meth:`learn_chunk` books them
        (``run.add_fused`` for a run of steps at once, and ``run.counted`` for the optimiser steps); the summed loss.
        What the fused and native engines run."""
        raise NotImplementedError(f"{type(self).__name__} has no fused steps")

    def fused_ready(self, batch: StreamSteps, start: int) -> bool:
        """Whether :meth:`learn_fused` takes over from chunk ``start`` (until then :meth:`learn_chunk` runs)."""
        return True

    def fused_refusal(self, chunk_size: int | None = None) -> str | None:
        """Why this learner's settings (and, once training starts, the stream's ``chunk_size``) keep its fused steps
        from computing :meth:`learn_chunk`'s numbers, as a phrase; ``None`` when they do."""
        return None

    def native_refusal(self) -> str | None:
        """Why this learner's settings keep its network steps' C form from computing them, as a phrase; ``None``
        when they do (asked by the native engine only)."""
        return None

    def add_task_terms(self, terms: Terms, online: list[tuple[Tensor, Tensor]]) -> None:
        """Add a batch's held-back task-mean terms, its online predictions scored as one term (a step engine's)."""
        if online:  # the weighted mean of the chunks' scores is the score of all their examples (float64)
            pred, y = torch.cat([p for p, _ in online]), torch.cat([t for _, t in online])
            values, weights = terms.setdefault(online_key(self.metric_name), ([], []))
            values.append(self.score(pred.double(), y))
            weights.append(pred.shape[0])
        add_terms(self._task_means, terms, self.device)

    def on_fit_start(self) -> None:
        """Stop optimiser steps from trying to load a missing NVML; refuse ``StreamSteps`` batches the run cannot
        learn (:func:`~cl_lightning.learners.engines.check_steps`)."""
        drop_unloadable_nvml_check()
        check_steps(self, self.trainer.datamodule, self.trainer.world_size)

    def on_train_start(self) -> None:
        """Take the engine that serves this run (``auto``: fused or autograd) or refuse the run; count an older
        checkpoint's automatic-optimisation steps as the engine's."""
        if self.engine is not None:
            self.engine = self.engine.for_run(self)
            lightning_compat.adopt_automatic_steps(self.trainer)

    def on_train_epoch_start(self) -> None:
        """Start the task means of :meth:`log_task_mean` afresh."""
        self._task_means = {}

    def on_train_epoch_end(self) -> None:
        """Log the task means of :meth:`log_task_mean`, reduced over DDP ranks (subclasses call ``super()``)."""
        for name, value in reduce_task_means(self._task_means, self.device).items():
            self.log(name, value, on_step=False, on_epoch=True)
        self._task_means = {}

    def training_step(self, batch: StreamBatch | StreamSteps, batch_idx: int) -> Tensor | dict[str, Any] | None:
        """Predict the incoming chunk (:meth:`log_online`), then learn from it; by default each chunk of the batch
        in turn through the step engine."""
        if self.engine is None:  # learns_steps: a training_step below learn_chunk's class steps by itself (EWC)
            raise TypeError(
                f"{type(self).__name__} overrides training_step, so it has no step engine to delegate to: put "
                "per-chunk work in learn_chunk (the engine runs it) instead of calling super().training_step"
            )
        return self.engine.learn(self, batch)

    @abstractmethod
    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """Predictions (logits or values) for ``query_x`` given a labelled context of the same task."""

    def forward(self, x: Tensor) -> Tensor:
        """Predict from the learner's own memory only (no context given)."""
        return self.predict_episode(x[:0], torch.zeros(0, dtype=torch.long, device=x.device), x)

    def extra_readings(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> dict[str, Tensor]:
        """Further predictions of an episode by reading (``"live"``: ``forward_live_acc``), each logged beside
        :meth:`predict_episode`'s score. Default: none."""
        return {}

    def validation_step(self, batch: EvalBatch, batch_idx: int) -> None:
        """Score one episode's readings (forward, backward or a probe task of the accuracy matrix; at test, the final
        model's) and log each under every slot (:func:`~cl_lightning.contract.metric_key`)."""
        context_x, context_y, query_x, query_y = batch.episode
        readings: dict[str | None, Tensor] = {None: self.predict_episode(context_x, context_y, query_x)}
        readings.update(self.extra_readings(context_x, context_y, query_x))
        for reading, pred in readings.items():
            value = self.score(pred, query_y)
            for slot in batch.slots:  # every rank evaluates every episode: DDP averages the ranks' scores
                key = metric_key(slot, self.metric_name, reading)
                self.log(key, value, add_dataloader_idx=False, batch_size=1, sync_dist=True)
                if (summary := summary_key(slot, self.metric_name, reading)) is not None:  # mean over the row: ACC
                    self.log(summary, value, add_dataloader_idx=False, batch_size=1, sync_dist=True)

    test_step = validation_step

    def configure_optimizers(self) -> torch.optim.Optimizer | None:
        """Call the optimiser factory on the trainable parameters (``None`` when there are none)."""
        params = [p for p in self.parameters() if p.requires_grad]
        return self.optimizer_factory(params) if params else None

    @abstractmethod
    def output_layer(self) -> nn.Module | None:
        """The learner's read-out layer: the module whose parameters the Hessian monitor differentiates by default
        (the paper's "last layer": the output layer of a network, the final layer of QOA's scorer). ``None`` when
        the learner has no trained read-out (kNN)."""

    def probe_layers(self) -> dict[str, nn.Module]:
        """The hidden layers plasticity callbacks watch, by name (their outputs after ReLU are the features).

        Default: every ``nn.Linear`` but :meth:`output_layer`; learners whose layers run without calling their
        modules override it (forward hooks would never fire).
        """
        out = self.output_layer()
        return {name: m for name, m in self.named_modules() if isinstance(m, nn.Linear) and m is not out}

    def context_memory_bytes(self) -> int:
        """Bytes of the learner's context memory (replay buffer, fast-weight state…). Default: every registered
        buffer's."""
        return tensor_bytes(self.buffers())
