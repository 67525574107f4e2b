"""What ``--ckpt_path`` does to a run: a resume continues the *same* run, in its folder.

:mod:`cl_lightning.run.checkpointing` finds the run and checkpoint to continue
(:func:`~cl_lightning.run.checkpointing.find_resume`; ``--ckpt_path last``: the newest run of the config) and checks
that the checkpoint fits the config (:func:`~cl_lightning.run.checkpointing.check_resume`). The CLI
(:mod:`cl_lightning.run.cli`) applies that here: :func:`open_run` before anything is built, :func:`check_resumed`
once the learner and the Trainer are.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from cl_lightning.lightning_compat import checkpoint_logged_steps, set_purge_step
from cl_lightning.run.checkpointing import (
    ConfigOptimizerValues,
    Resume,
    check_resume,
    experiment_dir,
    find_resume,
    version_of,
)
from cl_lightning.run.runfolder import hold


def open_run(config: Any, subcommand: str) -> Resume | None:
    """The run and checkpoint ``--ckpt_path`` continues (``None``: none given); a ``fit`` locks that run's folder
    (:func:`~cl_lightning.run.runfolder.hold`) and logs into it, its ``version_N`` set in ``config``'s logger."""
    resume = find_resume(config, subcommand)
    if subcommand in EVALUATIONS:
        evaluation_folder(config, subcommand, resume)
    if resume is not None and resume.run is not None and subcommand == "fit":
        hold(resume.run)  # before anything is written into it
        config.trainer.logger.init_args.version = version_of(resume.run)
        # ModelCheckpoint warns that the folder holds checkpoints: here that is the point
        warnings.filterwarnings("ignore", message=".*Checkpoint directory .* exists and is not empty.*")
    return resume


EVALUATIONS = ("validate", "test")


def evaluation_folder(config: Any, subcommand: str, resume: Resume | None) -> None:
    """Log a ``validate`` / ``test`` where no ``--ckpt_path last`` mistakes it for a run to continue, and say what it
    evaluates when no checkpoint is given.

    Evaluating a run's checkpoint logs into ``<run>/<subcommand>_K`` (beside its ``checkpoints/``); anything else
    into ``<save_dir>/<name>/<subcommand>_K``, never a new ``version_N`` (the folders ``last`` picks from). A logger
    ``version`` the user set is kept, unless it names the evaluated run itself.
    """
    if resume is None or resume.checkpoint is None:
        sys.stderr.write(
            f"{subcommand}: no --ckpt_path, so this evaluates the config's untrained learner (its initial weights); "
            f"--ckpt_path last evaluates the newest fit of this config\n"
        )
    logger = config.trainer.get("logger")
    init = logger.get("init_args") if hasattr(logger, "get") else None
    experiment = experiment_dir(config) if init is not None else None
    if experiment is None:
        return
    run = resume.run if resume is not None else None
    version = init.get("version")
    if run is None and version is not None and not (experiment / str_version(version)).is_dir():
        return  # a folder of the user's own choosing
    parent = run if run is not None else experiment
    taken = {p.name for p in parent.glob(f"{subcommand}_*")} if parent.is_dir() else set()
    name = next(f"{subcommand}_{k}" for k in range(len(taken) + 1) if f"{subcommand}_{k}" not in taken)
    init.version = f"{run.name}/{name}" if run is not None else name


def str_version(version: int | str) -> str:
    """The folder name of a logger ``version``: ``version_N`` for a number, else the name itself."""
    return f"version_{version}" if isinstance(version, int) else str(version)


def check_resumed(
    resume: Resume, model: LightningModule, trainer: Trainer, data: dict[str, Any] | None, accept: bool
) -> None:
    """Refuse a checkpoint of another learner or other hyperparameters; purge the resumed run's later steps.

    Args:
        resume: What :func:`open_run` found.
        model: The learner built from the config.
        trainer: The Trainer built from the config.
        data: The config's data section (``fit``; ``None``: not compared).
        accept: ``--accept_changed_hparams``: resume despite other hyperparameters, with the config's values.
    """
    if resume.checkpoint is not None and check_resume(resume.checkpoint, resume.path, model, data, accept):
        trainer.callbacks.append(ConfigOptimizerValues())  # accepted changes
    logger = trainer.logger
    if resume.run is not None and isinstance(logger, TensorBoardLogger):
        # TensorBoard drops the steps a killed run logged after its checkpoint: one run, continuous curves.
        step = checkpoint_logged_steps(resume.checkpoint) + 1 if resume.checkpoint is not None else 0
        set_purge_step(logger, step)
