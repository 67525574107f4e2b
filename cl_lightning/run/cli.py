"""The command line: ``python -m cl_lightning {fit,validate,test} --config configs/X.yaml``.

A LightningCLI in subclass mode: the learner is any :class:`ContinualLearner` chosen by ``class_path``, the
benchmark is injected into the one :class:`StreamDataModule` by ``class_path``, data shapes are linked from the
data module to the learner, and ``trainer.max_epochs`` is filled in from the stream's number of tasks.

What the CLI adds to every run, so a run can be trusted:

- **errors**: a mistake in the config or on the command line is one line (``error: …``), exit code 2, no
  traceback (``--debug`` or ``CL_LIGHTNING_DEBUG=1`` shows it), and nothing is written under ``logs/``: the
  config, the checkpoint and the data are checked before the Trainer creates the run folder, and an attempt that
  fails before its first step is undone (:class:`~cl_lightning.run.runfolder.Snapshot`);
- **stopping**: SIGTERM or SIGINT stops the run between two steps (:mod:`cl_lightning.run.stopping`): no partial
  checkpoint, one line saying where it stopped and how to resume, exit code 143 / 130 (``validate`` / ``test``:
  at the next batch, the same codes); a run whose last task was complete when the signal came exits 0;
- **one writer**: a run folder is locked while a ``fit`` writes it (:mod:`cl_lightning.run.runfolder`); a second
  ``fit`` or resume of the same run is refused in one line;
- **divergence**: :class:`~cl_lightning.callbacks.divergence.DivergenceStop` stops a run whose loss or weights
  turn NaN/inf (exit code 1), before that task's evaluation and checkpoint;
- **resume**: ``--ckpt_path`` continues the *same* run (its ``version_N`` folder, TensorBoard curves purged of
  the steps after the checkpoint); ``--ckpt_path last`` finds the newest run of the config; a checkpoint built
  with another learner or other hyperparameters is refused, listing the differences
  (``--accept_changed_hparams true`` resumes anyway, with the config's values);
- **crash safety**: checkpoints are written by :class:`~cl_lightning.run.checkpointing.AtomicCheckpointIO`
  (temporary file, fsync, rename), so ``kill -9`` at any moment leaves a checkpoint to resume from;
- **quiet output**: no deprecation warnings or advertisements; a summary of the run is the last thing printed.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import ArgsType, LightningArgumentParser
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import cl_lightning.callbacks
import cl_lightning.data
import cl_lightning.learners  # noqa: F401 - makes short learner names resolve
from cl_lightning.callbacks import ForgettingMonitor
from cl_lightning.callbacks.divergence import DivergenceError, DivergenceStop
from cl_lightning.callbacks.progress import TaskProgressBar
from cl_lightning.data.datamodule import StreamDataModule
from cl_lightning.errors import DEBUG_HINT, UsageError, debug_requested
from cl_lightning.heap import fix_mmap_threshold
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.lightning_compat import CompatCLI, SIGTERMException, steps_run
from cl_lightning.run import stopping
from cl_lightning.run.checkpointing import (
    AtomicCheckpointIO,
    DataRecord,
    Resume,
    check_resumed,
    open_run,
    remove_temp_files,
)
from cl_lightning.run.cli_messages import ConciseArgumentParser, HeldLines, describe, file_system_message, quiet
from cl_lightning.run.compose import CALLBACK_SLOTS, INCLUDE_KEY, expand_includes
from cl_lightning.run.runfolder import Snapshot, hold, release_all
from cl_lightning.run.stopping import GracefulStop, StopRequested, exit_code, stop_message
from cl_lightning.run.summary import run_summary

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
    "Train a learner on a stream, one epoch per task. Threads: one (fast for the small networks of the CPU streams, "
    "above all on a machine with other work); OMP_NUM_THREADS=N before the command sets N."
)

SLOT_HELP = "null turns it off; a subclass by class_path; its options follow"


class CLI(CompatCLI):
    """LightningCLI with the stream → learner links, one epoch per task, and the checks of the module docstring."""

    resume: Resume | None = None
    command_line: ClassVar[list[str]] = []  # the arguments after ``python -m cl_lightning``, for the resume hint
    stop: ClassVar[GracefulStop] = GracefulStop()  # installed by main() for the whole command
    start_lines: ClassVar[HeldLines]  # Lightning's start-up lines, held by main() until the run starts

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the data module's shapes into the learner (they are never typed in a config)."""
        for name in ("input_shape", "num_outputs", "task_type"):
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        parser.add_argument(
            "--accept_changed_hparams",
            type=bool,
            default=False,
            help="Resume from a checkpoint whose learner or data settings differ from the config (the config's win).",
        )
        self.add_composition_arguments(parser)

    def add_composition_arguments(self, parser: LightningArgumentParser) -> None:
        """Config composition (:mod:`cl_lightning.run.compose`) and the Trainer settings the code requires.

        ``include`` (read before parsing; hidden, never dumped), the named callback slots ``callbacks.<name>`` and
        ``trainer.reload_dataloaders_every_n_epochs: 1`` (one task per epoch: the data module checks it).
        """
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

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The Trainer, given the named callbacks (slots set to null are off) before ``trainer.callbacks``;
        ``--trainer.enable_checkpointing=false`` turns the ``checkpoint`` slot off, as it would in LightningCLI."""
        slots = self.section(self.config_init, "callbacks") or {}
        trainer = self.section(self.config_init, "trainer", default={})
        off = {"checkpoint"} if trainer.get("enable_checkpointing") is False else set()
        named = [slots[n] for n in CALLBACK_SLOTS if slots.get(n) is not None and n not in off]
        if named:
            listed = trainer.get("callbacks") or []
            kwargs.setdefault("callbacks", [*named, *(listed if isinstance(listed, list) else [listed])])
        return super().instantiate_trainer(**kwargs)

    def resolve_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path`` and lock the run it continues (:func:`~cl_lightning.run.checkpointing.open_run`);
        never let the checkpoint's hyperparameters replace the config's, as Lightning's own version does (they are
        compared after instantiation instead)."""
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
        if self.subcommand == "fit":
            self._dump_config()
            self.trainer.callbacks.append(DataRecord(self.config_dump.get("data") or {}))
        if self.resume is not None:
            data = (self.config_dump.get("data") or {}) if self.subcommand == "fit" else None
            accept = bool(self.config[self.subcommand].get("accept_changed_hparams"))
            check_resumed(self.resume, self.model, self.trainer, data, accept)

    def build_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        """Add the task progress bar, the divergence stop and atomic checkpoint writes unless the config has its own."""
        configured = list(config.get("callbacks") or []) + list(callbacks)
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in configured):
            callbacks = [*callbacks, TaskProgressBar()]
        if not any(isinstance(c, DivergenceStop) for c in configured):
            callbacks = [*callbacks, DivergenceStop()]
        plugins = config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            config["plugins"] = [*plugins, AtomicCheckpointIO()]
        return super().build_trainer(config, callbacks)

    def before_fit(self) -> None:
        """Check what would otherwise fail inside ``fit`` after the run folder exists: epochs and data on disk."""
        data = self.datamodule
        if isinstance(data, StreamDataModule):
            try:
                data.check_epochs(self.trainer)  # the data module checks it again in setup, for a Trainer of one's own
            except ValueError as error:
                raise UsageError(str(error)) from None
        data.prepare_data()
        if self.resume is not None and self.resume.run is not None:
            remove_temp_files(self.resume.run / "checkpoints")
        self.start_lines.let_through()  # the checks passed: Lightning's start-up lines may be printed
        self._started = time.monotonic()

    def before_validate(self) -> None:
        """Print Lightning's start-up lines (held while the run was built)."""
        self.start_lines.let_through()

    def before_test(self) -> None:
        """Print Lightning's start-up lines (held while the run was built)."""
        self.start_lines.let_through()

    def fit(self, model: LightningModule, datamodule: LightningDataModule | None = None, **kwargs: Any) -> None:
        """``Trainer.fit`` holding the run folder's lock; stops cleanly on SIGTERM / SIGINT; an attempt that fails
        or is stopped before its first step is undone (a new folder removed, a resumed one as it was)."""
        log_dir = Path(self.trainer.log_dir) if self.trainer.logger is not None and self.trainer.log_dir else None
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
                signum = stop.signal_of(error)
                sys.stderr.write(stop_message(self.trainer, signum, self.command_line, undone) + "\n")
                raise SystemExit(exit_code(signum)) from None
            if isinstance(error, DivergenceError) and log_dir is not None:  # what it left behind, besides
                raise DivergenceError(f"{error}; its logs up to there are in {log_dir}") from error
            if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):  # the file system said no
                cause = file_system_message(error)
                raise UsageError(stopping.halt_message(self.trainer, cause, self.command_line, undone)) from error
            raise

    def validate(self, **kwargs: Any) -> None:
        """``Trainer.validate``; SIGTERM / SIGINT stop it at its next batch (exit 143 / 130)."""
        stopping.evaluate_stoppable(self.trainer, self.trainer.validate, self.stop, **kwargs)

    def test(self, **kwargs: Any) -> None:
        """``Trainer.test``; SIGTERM / SIGINT stop it at its next batch (exit 143 / 130)."""
        stopping.evaluate_stoppable(self.trainer, self.trainer.test, self.stop, **kwargs)

    def after_fit(self) -> None:
        """Print what happened and where it is, as the last lines of the run."""
        monitor = next((c for c in self.trainer.callbacks if isinstance(c, ForgettingMonitor)), None)
        recent = monitor.recent_means(10) if monitor is not None else None
        seconds = time.monotonic() - getattr(self, "_started", time.monotonic())
        sys.stdout.write(run_summary(self.trainer, seconds, recent))


def main(args: list[str] | None = None, run: bool = True) -> CLI:
    """Entry point of ``python -m cl_lightning`` and the ``cl-lightning`` script.

    Config and command-line mistakes exit with code 2 and one ``error:`` line; a diverged run exits with code 1.
    ``--debug`` (anywhere in the arguments) or ``CL_LIGHTNING_DEBUG=1`` shows full tracebacks instead.
    """
    debug = debug_requested(sys.argv if args is None else args)
    if args is None:
        while "--debug" in sys.argv:  # LightningCLI reads sys.argv itself
            sys.argv.remove("--debug")
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
            ContinualLearner,
            StreamDataModule,
            subclass_mode_model=True,
            auto_configure_optimizers=False,
            save_config_kwargs={"overwrite": True},
            parser_class=ConciseArgumentParser,
            parser_kwargs={
                "description": DESCRIPTION,
                "prog": "python -m cl_lightning",
                "fit": {"description": FIT_DESCRIPTION},
            },
            args=args,
            run=run,
        )
    except DivergenceError as error:
        if debug:
            raise
        _fail(error, code=1)
    except (ValueError, FileNotFoundError, NotADirectoryError, ImportError) as error:
        if debug:
            raise
        _fail(error, code=2)
    except OSError as error:  # a read-only or unwritable folder, a full disk: no traceback either
        if debug:
            raise
        _fail(UsageError(file_system_message(error)), code=2)
    finally:
        CLI.start_lines.close()
        if run:
            CLI.stop.restore()
            release_all()
    if run and cli.subcommand == "fit":
        CLI.stop.finished()
    return cli


def _fail(error: BaseException, code: int) -> NoReturn:
    hint = "" if isinstance(error, DivergenceError) else f" ({DEBUG_HINT})"
    sys.stderr.write(f"error: {describe(error)}{hint}\n")
    raise SystemExit(code)
