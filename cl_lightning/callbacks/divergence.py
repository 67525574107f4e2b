"""Stop a run whose loss or weights stop being finite, naming the task, the step and the likely cause."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from cl_lightning.lightning_compat import logged_steps


class DivergenceError(RuntimeError):
    """Training produced a non-finite loss or weight; the run stopped before evaluating or checkpointing it."""


class DivergenceStop(Callback):
    """Raises :class:`DivergenceError` as soon as a training loss, or at a task's end a weight, is NaN or infinite.

    A diverged learner otherwise trains on through every task with ``nan`` metrics and exits normally. The check
    runs before the task's evaluation and before its checkpoint, so the newest checkpoint on disk is the last good
    one. The CLI adds this callback to every run.

    Cost: one ``loss.item()`` per step on the CPU; on an accelerator each step's finiteness is folded into a device
    flag read every ``check_every_n_steps`` steps, and the parameters are checked at each task's end.

    Args:
        check_every_n_steps: Read the flag every this many steps. ``None``: every step on the CPU (exact step in the
            message, no cost), every 100 steps on an accelerator (the message then names a range of steps).
    """

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        if check_every_n_steps is not None and check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps must be >= 1 or null, got {check_every_n_steps}")
        self.check_every_n_steps = check_every_n_steps
        self._flag: Tensor | None = None
        self._last_checked = 0  # training steps of the run (1-based) checked so far
        self._step = 0  # training steps of the run seen so far

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start the task with a clear flag."""
        self._flag = None
        self._step = self._last_checked = logged_steps(trainer)  # restored on resume

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Fold this step's loss into the flag; read the flag every ``check_every_n_steps`` steps."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs  # training_step's: a tensor, dict or None
        if isinstance(loss, Tensor) and loss.device.type == "cpu" and loss.numel() == 1:
            if not math.isfinite(loss.item()):  # ~2 us; a tensor isfinite() costs ~10x that on the CPU
                self._flag = torch.tensor(True)
        elif isinstance(loss, Tensor):  # accelerator: fold into a device flag, no host synchronisation
            bad = ~torch.isfinite(loss.detach()).all()
            self._flag = bad if self._flag is None else self._flag | bad
        self._step += 1
        interval = self.check_every_n_steps or (1 if pl_module.device.type == "cpu" else 100)
        if self._step - self._last_checked >= interval:
            self._check(trainer, pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """At the task's end, before its evaluation and checkpoint: the pending flag and every parameter."""
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self._check(trainer, pl_module, weights=True)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The same check for runs without evaluation."""
        self._check(trainer, pl_module, weights=True)

    def _check(self, trainer: Trainer, pl_module: LightningModule, weights: bool = False) -> None:
        first, step = self._last_checked + 1, self._step
        self._last_checked = step
        if self._flag is not None and bool(self._flag):
            self._raise(trainer, pl_module, "the training loss is NaN or infinite", first, step)
        if weights:
            params = [p.detach() for p in pl_module.parameters()]
            if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
                self._raise(trainer, pl_module, "a weight is NaN or infinite", None, step)

    @staticmethod
    def _raise(trainer: Trainer, pl_module: LightningModule, what: str, first: int | None, step: int) -> None:
        task = trainer.current_epoch
        where = f"step {step}" if first is None or first >= step else f"steps {first}-{step}"
        lrs = sorted({g["lr"] for opt in trainer.optimizers for g in opt.param_groups if "lr" in g})
        lr = f" (lr {', '.join(f'{v:g}' for v in lrs)})" if lrs else ""
        saver = trainer.checkpoint_callback
        ckpt = getattr(saver, "last_model_path", "") or getattr(saver, "best_model_path", "")
        kept = f"; the last good checkpoint is {ckpt}" if ckpt else "; no checkpoint was written before it"
        raise DivergenceError(
            f"training diverged in task {task} ({where} of the run): {what}. Likely cause: a learning rate too high "
            f"for {type(pl_module).__name__}{lr}; lower model.init_args.optimizer.init_args.lr{kept}"
        )
