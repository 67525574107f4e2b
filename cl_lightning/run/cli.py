"""The command line: ``python -m cl_lightning {fit,validate,test} --config configs/X.yaml``.

A LightningCLI in subclass mode (learner and stream by ``class_path``), with what makes a run trustworthy: the
README ("Resume, stop, and when something goes wrong") and docs/architecture.md ("The life of one run") list it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import ArgsType, LightningArgumentParser
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

import cl_lightning.learners  # noqa: F401 - makes short learner names resolve (callbacks, data: imported below)
from cl_lightning.callbacks import ForgettingMonitor
from cl_lightning.callbacks.divergence import DivergenceError, DivergenceStop
from cl_lightning.callbacks.progress import TaskProgressBar
from cl_lightning.data.datamodule import StreamDataModule
from cl_lightning.errors import USAGE_EXIT, UsageError, debug_requested, fail
from cl_lightning.heap import fix_mmap_threshold
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.lightning_compat import CompatCLI, steps_run
from cl_lightning.run import stopping, threads
from cl_lightning.run.checkpointing import (
    AtomicCheckpointIO,
    DataRecord,
    Resume,
    check_resumed,
    open_run,
    remove_temp_files,
    tasks_done,
)
from cl_lightning.run.cli_messages import LINKED, ConciseArgumentParser, HeldLines, describe, file_system_message, quiet
from cl_lightning.run.compose import CALLBACK_SLOTS, INCLUDE_KEY, expand_includes
from cl_lightning.run.runfolder import Snapshot, hold, release_all
from cl_lightning.run.stopping import GracefulStop, StopRequested
from cl_lightning.run.summary import run_summary
from cl_lightning.run.thread_phases import TrainingThreads

DESCRIPTION = (
    "cl_lightning: continual learning from a stream on PyTorch Lightning - query-only attention, parametric "
    "(fast-weight) attention and their baselines on Permuted MNIST, slowly changing regression and Split "
    "MNIST / Tiny ImageNet, with forgetting, plasticity and Hessian monitors. Start with the CPU demo (a few "
    "minutes on one core): `python -m cl_lightning fit --config configs/qoa_pmnist.yaml "
    "--config configs/quick_demo.yaml --config configs/quick_qoa.yaml`; "
    "`python -m cl_lightning fit --model.help QueryOnlyAttention` documents a learner; "
    "`--ckpt_path last` resumes the newest run of a config; `--debug` shows tracebacks. "
    "`python -m cl_lightning sweep --help` and `report --help`: suites of experiments x seeds and their report."
)
USAGE = "python -m cl_lightning {fit,validate,test,predict,sweep,report} ... (a command's --help: its options)"
FIT_DESCRIPTION = (
    "Train a learner on a stream, one epoch per task. Threads: every usable core; on a machine busy at start, "
    "training steps on one (docs/results/threads.md); OMP_NUM_THREADS=N before the command pins N."
)

SLOT_HELP = "null turns it off; a subclass by class_path; its options follow"


class CLI(CompatCLI):
    """LightningCLI with the stream → learner links, one epoch per task, and the safeguards of a run."""

    resume: Resume | None = None
    command_line: ClassVar[list[str]] = []  # the arguments after ``python -m cl_lightning``, for the resume hint
    stop: ClassVar[GracefulStop] = GracefulStop()  # installed by main() for the whole command
    start_lines: ClassVar[HeldLines]  # Lightning's start-up lines, held by main() until the run starts

    def __init__(self, args: ArgsType = None, run: bool = True, **kwargs: Any) -> None:
        """Any :class:`ContinualLearner` on the one :class:`StreamDataModule` (``kwargs``: LightningCLI's)."""
        super().__init__(
            ContinualLearner,
            StreamDataModule,
            subclass_mode_model=True,
            auto_configure_optimizers=False,
            parser_class=ConciseArgumentParser,
            args=args,
            run=run,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the data module's shapes into the learner; add ``--accept_changed_hparams``, ``include`` (hidden) and
        the callback slots (:mod:`cl_lightning.run.compose`); one task per epoch needs
        ``reload_dataloaders_every_n_epochs: 1``."""
        for name in LINKED:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        parser.add_argument(
            "--accept_changed_hparams",
            type=bool,
            default=False,
            help="Resume from a checkpoint whose learner or data settings differ from the config (the config's win).",
        )
        parser.add_argument(f"--{INCLUDE_KEY}", type=list[str] | str | None, default=None, help=argparse.SUPPRESS)
        for name, callback in CALLBACK_SLOTS.items():
            key = f"callbacks.{name}"
            parser.add_subclass_arguments(
                callback, key, required=False, fail_untyped=False, metavar="null | CLASS", help=SLOT_HELP
            )
            parser.groups[key].title = f"{key}: {callback.__name__}"
        parser.set_defaults({"trainer.reload_dataloaders_every_n_epochs": 1})

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse with each ``--config`` preceded by the fragments it includes."""
        parser.usage = USAGE  # set after the subcommands took their names from the default usage; names all six
        expanded = expand_includes(sys.argv[1:] if args is None else args) if isinstance(args, list | None) else args
        ConciseArgumentParser.arguments = expanded if isinstance(expanded, list) else []
        if args is None:  # the command line, expanded (passing it as ``args`` would warn about mixing the two)
            self.config = parser.parse_args(expanded)
            return
        super().parse_arguments(parser, expanded)

    def resolve_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path`` and lock the run it continues (:func:`~cl_lightning.run.checkpointing.open_run`),
        keeping the config's hyperparameters (Lightning's version takes the checkpoint's)."""
        sub = self.config.get("subcommand")
        self.resume = open_run(self.config[sub], sub) if sub else None

    def before_instantiate_classes(self) -> None:
        """Set ``trainer.max_epochs`` to the stream's ``num_tasks`` unless the config sets it."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        stream = config.data.stream
        num_tasks = stream.init_args.get("num_tasks") if hasattr(stream, "init_args") else None
        if num_tasks is not None and config.trainer.max_epochs is None:
            config.trainer.max_epochs = num_tasks

    def instantiate_classes(self) -> None:
        """Build the data module, learner and Trainer; a constructor's ``TypeError`` is a config mistake here."""
        try:
            super().instantiate_classes()
        except TypeError as error:
            raise UsageError(describe(error)) from error
        except MisconfigurationException as error:  # e.g. --trainer.accelerator gpu on a machine without one
            if not re.search(r"accelerator|device|gpu|cuda|mps|tpu", str(error), re.IGNORECASE):
                raise UsageError(describe(error)) from error
            accelerator = self.section(self.config, "trainer").get("accelerator")
            hint = "" if accelerator in ("cpu", "auto") else "; without one use --trainer.accelerator cpu"
            raise UsageError(f"trainer.accelerator={accelerator}: {describe(error)}{hint}") from error

    def after_instantiate_classes(self) -> None:
        """Record the data config in checkpoints; check a resumed checkpoint against the config."""
        data = (self.config_data().get("data") or {}) if self.subcommand == "fit" else None
        if data is not None:
            self.trainer.callbacks.append(DataRecord(data))
        if self.resume is not None:
            accept = bool(self.config[self.subcommand].get("accept_changed_hparams"))
            check_resumed(self.resume, self.model, self.trainer, data, accept)

    def build_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        """The Trainer with the slots' callbacks (``enable_checkpointing=false`` turns ``checkpoint`` off) before
        ``trainer.callbacks``, and the task progress bar, the divergence stop and atomic checkpoint writes unless the
        config has its own."""
        slots = self.section(self.config_init, "callbacks") or {}
        off = {"checkpoint"} if config.get("enable_checkpointing") is False else set()
        named = [slots[n] for n in CALLBACK_SLOTS if slots.get(n) is not None and n not in off]
        listed = config.get("callbacks") or []
        config["callbacks"] = [*named, *(listed if isinstance(listed, list) else [listed])]
        configured = config["callbacks"] + list(callbacks)
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in configured):
            callbacks = [*callbacks, TaskProgressBar()]
        if not any(isinstance(c, DivergenceStop) for c in configured):
            callbacks = [*callbacks, DivergenceStop()]
        if not any(isinstance(c, TrainingThreads) for c in configured):  # the policy's training threads, checkpointed
            callbacks = [*callbacks, TrainingThreads(threads.ACTIVE)]
        plugins = config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            config["plugins"] = [*plugins, AtomicCheckpointIO()]
        return super().build_trainer(config, callbacks)

    def before_fit(self) -> None:
        """Check what would otherwise fail inside ``fit`` after the run folder exists: epochs, data on disk and the
        optimiser's arguments (built once and dropped)."""
        data = self.datamodule
        if isinstance(data, StreamDataModule):
            try:
                data.check_epochs(self.trainer)  # the data module checks it again in setup, for a Trainer of one's own
            except ValueError as error:
                raise UsageError(str(error)) from None
        data.prepare_data()
        self.model.configure_optimizers()  # a bad optimiser argument fails here, before Lightning's start-up lines
        if self.resume is not None and self.resume.run is not None:
            remove_temp_files(self.resume.run / "checkpoints")
        self.start_lines.let_through()  # the checks passed: Lightning's start-up lines may be printed
        self._share_cores()
        if threads.ACTIVE is not None and self.trainer.is_global_zero:
            sys.stderr.write(threads.ACTIVE.describe() + "\n")
        self._started = time.monotonic()

    def _share_cores(self) -> None:
        """Several processes of this run on the CPU (DDP): divide the thread policy's cores between them, in this
        process and in the environment the other ranks start from (they take it as a setting of the user's)."""
        policy, trainer = threads.ACTIVE, self.trainer
        if policy is None or trainer.num_devices <= 1 or not isinstance(trainer.accelerator, CPUAccelerator):
            return
        threads.ACTIVE = shared = policy.per_process(trainer.num_devices)
        os.environ["OMP_NUM_THREADS"] = str(shared.threads)
        torch.set_num_threads(shared.threads)
        for callback in trainer.callbacks:
            if isinstance(callback, TrainingThreads):
                callback.policy = shared

    def fit(self, model: LightningModule, datamodule: LightningDataModule | None = None, **kwargs: Any) -> None:
        """``Trainer.fit`` holding the run folder's lock, stopping cleanly on SIGTERM / SIGINT; an attempt that ends
        before its first step is undone. Under DDP only global rank 0 holds the folder: the other ranks (each a copy of
        this command, started by Lightning before any process group exists) would otherwise each open a version of
        their own and take the lock from their own rank 0."""
        owner = self.trainer.global_rank == 0 and self.trainer.logger is not None
        log_dir = Path(self.trainer.log_dir) if owner and self.trainer.log_dir else None
        snapshot = Snapshot(log_dir) if log_dir is not None else None
        if log_dir is not None:
            hold(log_dir)
        stop = self.stop
        self.trainer.callbacks.append(stop)
        try:
            self.trainer.fit(model, datamodule, **kwargs)
        except (Exception, SIGTERMException) as error:
            if isinstance(error, SIGTERMException) and stopping.all_tasks_done(self.trainer):
                stopping.complete_after_sigterm(self.trainer)  # Lightning's SIGTERM check after the last task
                return
            undone = snapshot is not None and steps_run(self.trainer) == 0 and not isinstance(error, DivergenceError)
            if undone:
                snapshot.undo()
            if isinstance(error, (StopRequested, SIGTERMException)):
                bar = "\n" if self.trainer.progress_bar_callback is not None else ""  # below the bar's line
                message = partial(stopping.stop_message, self.trainer, command_line=self.command_line, undone=undone)
                stop.exit(error, lambda cause: bar + message(cause))
            if isinstance(error, DivergenceError) and log_dir is not None:  # what it left behind, besides
                raise DivergenceError(f"{error}; its logs up to there are in {log_dir}") from error
            if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):  # the file system said no
                cause = file_system_message(error)
                raise UsageError(stopping.stop_message(self.trainer, cause, self.command_line, undone)) from error
            raise

    def evaluate(self, **kwargs: Any) -> None:
        """``Trainer.validate`` / ``Trainer.test`` with :attr:`stop` among its callbacks: a SIGTERM / SIGINT ends it at
        its next batch with one line and exit ``128 + signal``."""
        self.start_lines.let_through()
        self.trainer.callbacks.append(self.stop)
        try:
            getattr(self.trainer, self.subcommand)(**kwargs)
        except (StopRequested, SIGTERMException) as error:
            incomplete = "its scores are incomplete; run the same command again"
            self.stop.exit(error, lambda cause: f"{self.subcommand} {cause} before its last batch: {incomplete}")

    validate = test = evaluate

    def after_fit(self) -> None:
        """Print what happened and where it is, as the last lines of the run (once, on global rank 0; every rank
        builds them: ``trainer.log_dir`` is a collective under DDP)."""
        monitor = next((c for c in self.trainer.callbacks if isinstance(c, ForgettingMonitor)), None)
        recent = monitor.recent_means(10) if monitor is not None else None
        lower_is_better = getattr(self.trainer.lightning_module, "task_type", None) == "regression"
        average = monitor.last_average(lower_is_better) if monitor is not None else None
        seconds = time.monotonic() - getattr(self, "_started", time.monotonic())
        start = self.resume.checkpoint if self.resume is not None else None
        done_before = start is not None and (tasks_done(start) or 0) >= (self.trainer.max_epochs or 0)
        summary = run_summary(self.trainer, seconds, recent, average, done_before)
        if self.trainer.is_global_zero:
            sys.stdout.write(summary)


def main(args: list[str] | None = None, run: bool = True) -> CLI:
    """Entry point of ``python -m cl_lightning``: a mistake is one ``error:`` line and exit code 2, a diverged run
    exit code 1 (``--debug`` or ``CL_LIGHTNING_DEBUG=1``: tracebacks)."""
    debug = debug_requested(sys.argv if args is None else args)
    if args is None:  # LightningCLI reads sys.argv itself
        sys.argv[:] = [a for a in sys.argv if a != "--debug"]
    else:
        args = [a for a in args if a != "--debug"]
    CLI.command_line = list(sys.argv[1:] if args is None else args)
    CLI.stop = GracefulStop()
    if run:
        CLI.stop.install()  # a SIGTERM / SIGINT from here on stops the run at its next step (or before its first)
    ConciseArgumentParser.debug = debug
    quiet()
    CLI.start_lines = HeldLines()  # a mistake found before the run starts is the only line on stderr
    fix_mmap_threshold()  # large tensors' pages go back to the OS when they die (cl_lightning.heap)
    try:
        cli = CLI(
            save_config_kwargs={"overwrite": True},
            parser_kwargs={
                "description": DESCRIPTION,
                "prog": "python -m cl_lightning",
                "fit": {"description": FIT_DESCRIPTION},
            },
            args=args,
            run=run,
        )
    except (DivergenceError, ValueError, ImportError, OSError) as error:
        if debug:
            raise
        if isinstance(error, OSError) and not isinstance(error, FileNotFoundError | NotADirectoryError):
            error = UsageError(file_system_message(error))  # a read-only or unwritable folder, a full disk
        diverged = isinstance(error, DivergenceError)
        fail(describe(error), code=1 if diverged else USAGE_EXIT, hint=not diverged)
    finally:
        CLI.start_lines.close()
        if run:
            CLI.stop.restore()
            release_all()
    if run and cli.subcommand == "fit":
        CLI.stop.finished()
    return cli
