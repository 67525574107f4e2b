"""Stopping a run on SIGTERM or SIGINT without damaging it: finish the current step, write nothing half-done.

:class:`GracefulStop` (added by the CLI to every ``fit``, ``validate`` and ``test``) turns SIGTERM (a scheduler,
``timeout``, a sweep) or SIGINT (Ctrl-C) into :class:`StopRequested` at the next training or evaluation batch, so
no checkpoint of the unfinished task is written; the CLI says where the run stopped and how to resume it, and exits
``128 + signal`` (143, 130). A signal after the last task stops nothing (:mod:`cl_lightning.run.process_signals`).
"""

from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.trainer.states import TrainerStatus

from cl_lightning.lightning_compat import tasks_closed
from cl_lightning.run import process_signals
from cl_lightning.run.checkpointing import kept_checkpoint, tasks_done
from cl_lightning.run.compose import scan_option
from cl_lightning.run.process_signals import FirstSignal


def stopped_by(signum: int) -> str:
    """How a message names a stop by ``signum``: ``stopped by SIGTERM``."""
    return f"stopped by {signal.Signals(signum).name}"


class StopRequested(Exception):  # noqa: N818 - a request, not an error
    """Raised between steps after SIGTERM or SIGINT; ``signum`` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(stopped_by(signum))
        self.signum = signum


class GracefulStop(FirstSignal, Callback):
    """Records SIGTERM / SIGINT while installed and stops the run at the next batch (a second signal changes nothing:
    ``kill -9`` ends a stuck process at once)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handle SIGTERM and SIGINT in this (main) thread until :meth:`restore`, taking over a signal the process
        received while it started (:func:`cl_lightning.run.process_signals.take`)."""
        for signum in process_signals.SIGNALS:
            self._previous[signum] = signal.signal(signum, self.record)
        self.record(process_signals.take())

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def finished(self) -> None:
        """The run ran to its end (call after :meth:`restore`): a signal after its last step, or from now on, gets one
        line and changes nothing (:func:`cl_lightning.run.process_signals.finished`)."""
        process_signals.finished(self.signum)

    def exit(self, error: BaseException, line: Callable[[str], str]) -> NoReturn:
        """End the command stopped by ``error``: ``line`` of :func:`stopped_by` the signal (the one recorded, else the
        error's: SIGTERM for Lightning's own) on stderr, and exit status 128 + its number."""
        signum = self.signum or getattr(error, "signum", signal.SIGTERM)
        sys.stderr.write(line(stopped_by(signum)) + "\n")
        raise SystemExit(128 + int(signum)) from None

    def stop_if_asked(self, trainer: Trainer, *hook_args: Any, **hook_kwargs: Any) -> None:
        """Raise :class:`StopRequested` once a signal was recorded: before the next training step, evaluation batch
        (a task's checkpoint, written after its evaluation, is not), batch of ``test``, or task. Under DDP the ranks
        decide together (the largest signal number any rank recorded), so every rank stops at the same batch: a
        signal usually reaches rank 0 alone, and a rank that stopped alone would leave the others waiting in a
        collective for ever."""
        signum = self.signum
        if trainer.world_size > 1:
            recorded = torch.tensor(float(signum or 0), device=trainer.strategy.root_device)
            signum = int(trainer.strategy.reduce(recorded, reduce_op="max")) or None
        if signum is not None:
            self.signum = signum
            raise StopRequested(signum)

    on_train_batch_start = on_validation_batch_start = on_test_batch_start = on_train_epoch_start = stop_if_asked

    def take_signals_back(self, trainer: Trainer, *hook_args: Any) -> None:
        """Under DDP, handle SIGTERM / SIGINT here alone again once Lightning has registered its own handler, which
        broadcasts from inside the handler: a collective that one rank enters at an arbitrary point, while the other
        waits in another, hangs both. :meth:`stop_if_asked` decides at the next batch instead."""
        if trainer.world_size > 1 and self._previous:
            for signum in process_signals.SIGNALS:
                signal.signal(signum, self.record)

    on_train_start = on_validation_start = on_test_start = take_signals_back


def resume_command(command_line: list[str]) -> str:
    """``python -m cl_lightning <the same arguments> --ckpt_path last`` (a ``--ckpt_path`` given before replaced)."""
    args = [arg for given, arg in scan_option(command_line, "--ckpt_path") if not given]
    return f"python -m cl_lightning {shlex.join([*args, '--ckpt_path', 'last'])}"


def stop_message(trainer: Trainer, cause: str, command_line: list[str], undone: bool) -> str:
    """One line for a run that ended before its last task (``cause``: :func:`stopped_by`, a file system error): the
    task it stopped in, what it left behind, and the command that resumes it."""
    where = f"{cause} at task {trainer.current_epoch + 1} of {trainer.max_epochs}"
    if undone:
        args = shlex.join(command_line)
        return f"{where}, before its first step: nothing was written; start it again with python -m cl_lightning {args}"
    ckpt = kept_checkpoint(trainer)
    if ckpt:
        done = tasks_done(Path(ckpt))
        kept = f"{ckpt} holds {done} finished task{'s' * (done != 1)}" if done is not None else f"kept {ckpt}"
    elif trainer.checkpoint_callback is not None and trainer.logger is not None:
        kept = "no checkpoint yet (the resume starts the run over in its folder)"
    else:
        return f"{where}; this config keeps no checkpoint, so the run cannot be resumed"
    return f"{where}; {kept}, no partial checkpoint; resume with {resume_command(command_line)}"


def all_tasks_done(trainer: Trainer) -> bool:
    """Whether the fit loop had closed the run's last task: Lightning's ``SIGTERMException`` raised as it closes the
    last task, after every file was written, leaves a complete run."""
    return trainer.max_epochs is not None and tasks_closed(trainer) >= trainer.max_epochs


def complete_after_sigterm(trainer: Trainer) -> None:
    """Mark a run :func:`all_tasks_done` found complete as finished (so: exit 0, its summary, one line for the signal)
    and write what Lightning's interrupted teardown skipped (TensorBoard's ``hparams.yaml``)."""
    trainer.state.status = TrainerStatus.FINISHED
    for logger in trainer.loggers:
        logger.save()
