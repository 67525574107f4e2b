"""What ``--ckpt_path`` does to a run: a resume continues the *same* run, in its folder.

:mod:`cl_lightning.run.checkpointing` finds the run and checkpoint to continue
(:func:`~cl_lightning.run.checkpointing.find_resume`; ``--ckpt_path last``: the newest run of the config) and checks
that the checkpoint fits the config (:func:`~cl_lightning.run.checkpointing.check_resume`). The CLI
(:mod:`cl_lightning.run.cli`) applies that here: :func:`open_run` before anything is built, :func:`check_resumed`
once the learner and the Trainer are.
"""

from __future__ import annotations

import warnings
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from cl_lightning.lightning_compat import checkpoint_logged_steps, set_purge_step
from cl_lightning.run.checkpointing import ConfigOptimizerValues, Resume, check_resume, find_resume, version_of
from cl_lightning.run.runfolder import hold


def open_run(config: Any, subcommand: str) -> Resume | None:
    """The run and checkpoint ``--ckpt_path`` continues (``None``: none given); a ``fit`` locks that run's folder
    (:func:`~cl_lightning.run.runfolder.hold`) and logs into it, its ``version_N`` set in ``config``'s logger."""
    resume = find_resume(config, subcommand)
    if resume is not None and resume.run is not None and subcommand == "fit":
        hold(resume.run)  # before anything is written into it
        config.trainer.logger.init_args.version = version_of(resume.run)
        # ModelCheckpoint warns that the folder holds checkpoints: here that is the point
        warnings.filterwarnings("ignore", message=".*Checkpoint directory .* exists and is not empty.*")
    return resume


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
