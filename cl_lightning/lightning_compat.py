"""Every use of Lightning's private API, under public names, with a check that it is still there.

:func:`missing_internals` lists what a Lightning upgrade removed or changed (``tests/test_lightning_compat.py``
fails on it): LightningCLI's private hooks ``_parse_ckpt_path``, ``_set_seed``, ``_instantiate_trainer``, ``_get``
and ``_dump_config`` (reached through :class:`CompatCLI`), ``TensorBoardLogger._kwargs`` (``purge_step`` has no
public slot), the epoch loop's logging step (``_batches_that_stepped``, also in a checkpoint) and step counts,
``LightningModule._trainer``, and the optimiser-step counters behind ``global_step`` that the step engines of
``learners/engines.py`` advance. This module imports nothing from the package, so every part may import it.
"""

from __future__ import annotations

import inspect
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger


class CompatCLI(LightningCLI):
    """LightningCLI whose private hooks are reached through public names (override those, not the private ones)."""

    def resolve_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path`` after parsing (Lightning's: take the checkpoint's hyperparameters)."""
        super()._parse_ckpt_path()

    def build_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        """Build the Trainer from its final arguments and the extra callbacks (Lightning's default)."""
        return super()._instantiate_trainer(config, callbacks)

    def section(self, config: Any, key: str, default: Any = None) -> Any:
        """``key`` of the running subcommand's part of ``config`` (``LightningCLI._get``)."""
        return self._get(config, key, default=default)

    def config_data(self) -> dict[str, Any]:
        """The running subcommand's resolved config as plain data, links filled in (``LightningCLI._dump_config``)."""
        self._dump_config()
        return self.config_dump

    def seed(self) -> None:
        """Seed everything from ``--seed_everything`` (Lightning's default)."""
        super()._set_seed()

    def _parse_ckpt_path(self) -> None:
        self.resolve_ckpt_path()

    def _set_seed(self) -> None:
        self.seed()

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        return self.build_trainer(config, callbacks)


def set_purge_step(logger: TensorBoardLogger, step: int) -> None:
    """Make the logger's SummaryWriter drop the events at and after ``step`` (set before it is created)."""
    logger._kwargs["purge_step"] = step


def logged_steps(trainer: Trainer) -> int:
    """The logging step of the run (restored on resume): Lightning's ``_batches_that_stepped``."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def steps_run(trainer: Trainer) -> int:
    """Training steps this process has run (0: nothing trained yet, not even on a resume)."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.total.completed)


def tasks_closed(trainer: Trainer) -> int:
    """Epochs (tasks) the fit loop has closed: counted before its end-of-epoch SIGTERM check raises."""
    return int(trainer.fit_loop.epoch_progress.current.completed)


def count_logged_chunks(module: LightningModule, chunks: int) -> None:
    """Advance the logging step of the Trainer ``module`` is attached to by ``chunks`` more than Lightning's one a
    batch: a batch of ``K`` chunks (``data.steps_per_batch``) moves it by ``K``, so every logged value lands on the
    step a run of one chunk per batch logs it at."""
    if module._trainer is not None:
        module._trainer.fit_loop.epoch_loop._batches_that_stepped += chunks


def count_optimizer_steps(module: LightningModule, steps: int) -> None:
    """Add ``steps`` optimiser steps taken outside Lightning's optimiser wrapper to the ``global_step`` of the
    Trainer ``module`` is attached to (none without one, as when a benchmark drives a learner)."""
    if module._trainer is not None:
        _add_manual_steps(module._trainer, steps)


def _add_manual_steps(trainer: Trainer, steps: int) -> None:
    """Add ``steps`` to manual optimisation's count of optimiser steps (``trainer.global_step``)."""
    progress = trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
    for tracker in (progress.total, progress.current):
        tracker.ready += steps
        tracker.completed += steps


def adopt_automatic_steps(trainer: Trainer) -> None:
    """Move the automatic loop's optimiser-step count into manual optimisation's (and zero it): a checkpoint written
    under automatic optimisation then resumes at its ``global_step`` under manual optimisation (once: the moved
    count is saved as manual from then on)."""
    loop = trainer.fit_loop.epoch_loop
    steps = loop.automatic_optimization.optim_progress.optimizer_steps
    if steps:
        _add_manual_steps(trainer, steps)
        loop.automatic_optimization.optim_progress.reset()


def checkpoint_logged_steps(checkpoint: dict[str, Any]) -> int:
    """The logging step a checkpoint resumes at (``_batches_that_stepped`` of its loop state; else ``global_step``)."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
    return int(loop.get("_batches_that_stepped", checkpoint.get("global_step", 0)))


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def missing_internals() -> list[str]:
    """What of the private API above this Lightning no longer has, or no longer uses as assumed (empty: all there)."""
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    problems = []
    hooks = (  # each private hook, its parameters, and the method of LightningCLI that runs it (or its work)
        ("_parse_ckpt_path", ["self"], "__init__", "self._parse_ckpt_path()"),
        ("_set_seed", ["self"], "__init__", "self._set_seed()"),
        ("_instantiate_trainer", ["self", "config", "callbacks"], "instantiate_trainer", "self._instantiate_trainer("),
        ("_dump_config", ["self"], "_dump_config", "self.config_dump = "),
    )
    for name, params, method, code in hooks:
        hook = getattr(LightningCLI, name, None)
        if hook is None or list(inspect.signature(hook).parameters) != params:
            problems.append(f"LightningCLI.{name}{params} is gone or has another signature")
        if code not in _source(getattr(LightningCLI, method, None)):
            problems.append(f"LightningCLI.{method} no longer runs `{code.strip()}`")
    if list(inspect.signature(LightningCLI._get).parameters)[:4] != ["self", "config", "key", "default"]:
        problems.append("LightningCLI._get(config, key, default) is gone or has another signature")
    logger = "".join(_source(cls) for cls in TensorBoardLogger.__mro__ if cls.__module__.startswith("lightning"))
    if "self._kwargs = kwargs" not in logger or "SummaryWriter(log_dir=self.log_dir, **self._kwargs)" not in logger:
        problems.append("TensorBoardLogger no longer passes self._kwargs to its SummaryWriter")
    loop = _source(_TrainingEpochLoop)
    if "self._batches_that_stepped" not in loop or '"_batches_that_stepped"' not in loop:
        problems.append("_TrainingEpochLoop._batches_that_stepped (and its state_dict key) is gone")
    if "self.batch_progress" not in loop:
        problems.append("_TrainingEpochLoop.batch_progress is gone")
    from lightning.pytorch.loops.fit_loop import _FitLoop

    end = _source(_FitLoop.on_advance_end)
    closed, check = end.find("self.epoch_progress.increment_completed()"), end.find("trainer.received_sigterm")
    if closed < 0 or not 0 <= closed < check:
        problems.append("_FitLoop.on_advance_end no longer counts the epoch complete before its SIGTERM check")
    if "self._trainer" not in _source(LightningModule.__init__):
        problems.append("LightningModule._trainer is gone")
    return problems + _missing_step_counters(loop)


def _missing_step_counters(loop: str) -> list[str]:
    """The optimiser-step counters :func:`count_optimizer_steps` and :func:`adopt_automatic_steps` reach."""
    from lightning.pytorch.loops.optimization.automatic import _AutomaticOptimization
    from lightning.pytorch.loops.optimization.manual import _ManualOptimization
    from lightning.pytorch.loops.progress import _OptimizationProgress, _Progress, _ReadyCompletedTracker

    problems = []
    for name in ("automatic_optimization = _AutomaticOptimization(", "manual_optimization = _ManualOptimization("):
        if f"self.{name}" not in loop:
            problems.append(f"_TrainingEpochLoop no longer sets self.{name}...)")
    if "self.optim_progress" not in _source(_AutomaticOptimization) or not all(
        hasattr(_OptimizationProgress, name) for name in ("optimizer_steps", "reset")
    ):
        problems.append("_AutomaticOptimization.optim_progress.optimizer_steps (or reset) is gone")
    manual = _source(_ManualOptimization)
    fields = {f for cls in (_Progress, _ReadyCompletedTracker) for f in getattr(cls, "__dataclass_fields__", {})}
    if "self.optim_step_progress" not in manual or not {"total", "current", "ready", "completed"} <= fields:
        problems.append("_ManualOptimization.optim_step_progress (total/current, ready/completed) is gone")
    return problems
