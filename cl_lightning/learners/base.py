"""The base class every learner keeps: shapes, optimiser factory, online metric and evaluation (docs/protocol.md)."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

TaskType = Literal["classification", "regression"]


def adam_1e4(params: Any) -> torch.optim.Optimizer:
    """Adam with lr 1e-4 and PyTorch's default betas: the optimiser of every learner in the QOA paper."""
    return torch.optim.Adam(params, lr=1e-4)


class ContinualLearner(LightningModule):
    """A learner on a task stream: one epoch is one task, one training batch is one chunk of the stream.

    Subclasses implement :meth:`training_step` (predict the incoming chunk first, log it with :meth:`log_online`,
    then learn) and :meth:`predict_episode` (answer held-out queries given a labelled context of the same task).

    Args:
        input_shape: Shape of one input (linked from the data module).
        num_outputs: Classes, or regression targets (linked from the data module).
        task_type: ``"classification"`` or ``"regression"`` (linked from the data module).
        optimizer: Optimiser factory called on the parameters (default: Adam, lr 1e-4, as the paper).
        seed: Seed of the learner's own sampling (support sets); draws depend on ``(seed, step)`` only.
    """

    def __init__(
        self,
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
        self._task_sums: dict[str, tuple[Tensor, float]] = {}  # name -> (weighted sum, weight) of the running task

    @property
    def metric_name(self) -> str:
        """``"acc"`` for classification, ``"mse"`` for regression."""
        return "acc" if self.task_type == "classification" else "mse"

    def step_generator(self) -> torch.Generator:
        """A generator seeded from ``(seed, step)``; advances the step counter (kept in checkpoints)."""
        gen = torch.Generator()
        gen.manual_seed(self.seed * 1_000_003 + int(self.steps_taken))
        self.steps_taken += 1
        return gen

    def loss(self, pred: Tensor, y: Tensor) -> Tensor:
        """Cross-entropy on logits, or MSE on predictions.

        The MSE is written out rather than ``F.mse_loss`` (bitwise the same value and gradient on CPU): torch 2.14's
        forward-over-reverse AD of ``mse_loss`` fails ("ZeroTensors are immutable"), and the Hessian monitor needs it.
        """
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
        self.log_task_mean(f"train/online_{self.metric_name}", self.score(pred.detach(), y), pred.shape[0])
        if loss is not None:
            self.log_task_mean("train/loss", loss, pred.shape[0])

    def log_task_mean(self, name: str, value: Tensor, weight: int = 1) -> None:
        """Add a batch mean ``value`` of ``weight`` examples to the task mean of ``name``, logged at the task's end.

        Equals ``self.log(name, value, on_step=False, on_epoch=True, batch_size=weight)`` but costs one tensor
        addition a step instead of Lightning's per-call bookkeeping (about a third of a one-example step:
        ``benchmarks/loop_overhead.py``), and sums over every DDP rank's chunks rather than reporting rank 0's alone.
        """
        value = value.detach().to(torch.float64) * weight
        total, count = self._task_sums.get(name, (0.0, 0.0))
        self._task_sums[name] = (value + total, count + weight)

    def on_train_epoch_start(self) -> None:
        """Start the task means of :meth:`log_task_mean` afresh."""
        self._task_sums = {}

    def on_train_epoch_end(self) -> None:
        """Log the task means of :meth:`log_task_mean`, reduced over DDP ranks (subclasses call ``super()``)."""
        names = sorted(self._task_sums)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[list[str] | None] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, names)  # a rank may have skipped a name (memory still filling)
            names = sorted(set().union(*(g or [] for g in gathered)))
        for name in names:
            total, count = self._task_sums.get(name, (0.0, 0.0))
            as64 = {"dtype": torch.float64, "device": self.device}
            pair = torch.stack([torch.as_tensor(total, **as64), torch.tensor(count, **as64)])
            total, weight = self.trainer.strategy.reduce(pair, reduce_op="sum")
            if weight > 0:
                self.log(name, (total / weight).float(), on_step=False, on_epoch=True)
        self._task_sums = {}

    @abstractmethod
    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """Predictions (logits or values) for ``query_x`` given a labelled context of the same task."""

    def forward(self, x: Tensor) -> Tensor:
        """Predict from the learner's own memory only (no context given)."""
        empty = x[:0]
        return self.predict_episode(empty, torch.zeros(0, dtype=torch.long, device=x.device), x)

    def extra_readings(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> dict[str, Tensor]:
        """Further predictions of an episode, by qualifier, each logged beside :meth:`predict_episode`'s score.

        A reading ``"live"`` of a metric logged as ``forward_acc`` is logged as ``forward_live_acc`` (``{m}`` in the
        episode's log names becomes ``live_{m}``). Default: none.
        """
        return {}

    def _evaluate(self, batch: dict[str, Any], prefix: str) -> None:
        args = batch["context_x"], batch["context_y"], batch["query_x"]
        readings = {"{m}": self.predict_episode(*args)}
        readings.update({f"{qualifier}_{{m}}": pred for qualifier, pred in self.extra_readings(*args).items()})
        for metric, pred in readings.items():
            value = self.score(pred, batch["query_y"])
            for name in batch["log_names"]:
                key = f"{prefix}/{name}".replace("{m}", metric).format(m=self.metric_name)
                self.log(key, value, add_dataloader_idx=False, batch_size=1)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Evaluate one episode (forward, backward or a probe task of the accuracy matrix)."""
        self._evaluate(batch, "eval")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Evaluate one probe task's episode with the final model."""
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer | None:
        """Call the optimiser factory on the trainable parameters (``None`` when there are none)."""
        params = [p for p in self.parameters() if p.requires_grad]
        return self.optimizer_factory(params) if params else None

    def probe_layers(self) -> dict[str, nn.Module]:
        """The hidden layers plasticity callbacks watch, by name: modules whose output, after the callback's
        activation (ReLU by default), is a hidden layer's features.

        Default: every ``nn.Linear`` but the last one registered (the output layer). A learner whose layers run
        without calling their modules (fused kernels) must override this, or forward hooks never fire.
        """
        linears = [(name, m) for name, m in self.named_modules() if isinstance(m, nn.Linear)]
        return dict(linears[:-1])

    def context_memory_bytes(self) -> int:
        """Bytes of the learner's context memory (replay buffer, fast-weight state…): what grows with what it keeps.

        Default: the bytes of every registered buffer (the package keeps all such state in buffers at final shape).
        Learners whose memory is held otherwise override this.
        """
        return sum(b.numel() * b.element_size() for b in self.buffers())
