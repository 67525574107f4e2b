"""The command line: ``python -m cl_lightning {fit,validate,test} --config configs/X.yaml``.

A LightningCLI in subclass mode: the learner is any :class:`ContinualLearner` chosen by ``class_path``, the
benchmark is injected into the one :class:`StreamDataModule` by ``class_path``, data shapes are linked from the
data module to the learner, and ``trainer.max_epochs`` is filled in from the stream's number of tasks.
"""

from __future__ import annotations

import warnings
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import cl_lightning.callbacks
import cl_lightning.data
import cl_lightning.learners  # noqa: F401 - makes short learner names resolve
from cl_lightning.callbacks.progress import TaskProgressBar
from cl_lightning.data.datamodule import StreamDataModule
from cl_lightning.learners.base import ContinualLearner


class CLI(LightningCLI):
    """LightningCLI with the stream → learner links and one epoch per task."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the data module's shapes into the learner (they are never typed in a config)."""
        for name in ("input_shape", "num_outputs", "task_type"):
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        """Set ``trainer.max_epochs`` to the stream's ``num_tasks`` unless the config sets it."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        stream = config.data.stream
        num_tasks = stream.init_args.get("num_tasks") if hasattr(stream, "init_args") else None
        if num_tasks is None:
            return
        if config.trainer.max_epochs is None:
            config.trainer.max_epochs = num_tasks

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        """Add the task-counting progress bar unless the config turns bars off or brings its own."""
        configured = list(config.get("callbacks") or []) + list(callbacks)
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in configured):
            callbacks = [*callbacks, TaskProgressBar()]
        return super()._instantiate_trainer(config, callbacks)


def main(args: list[str] | None = None, run: bool = True) -> CLI:
    """Entry point of ``python -m cl_lightning`` and the ``cl-lightning`` script."""
    # Expected on a stream, not problems: learners skip steps while their memory fills, a task's chunks are an
    # IterableDataset with a length, and a task may have fewer chunks than the logging interval. Lightning 2.6 on
    # torch 2.14 builds a deprecated pytree LeafSpec on every data reload (a library mismatch, not ours).
    for message in (
        ".*isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
        ".*`training_step` returned `None`.*",
        ".*`IterableDataset` has `__len__` defined.*",
        ".*smaller than the logging interval.*",
    ):
        warnings.filterwarnings("ignore", message=message)
    return CLI(
        ContinualLearner,
        StreamDataModule,
        subclass_mode_model=True,
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )
