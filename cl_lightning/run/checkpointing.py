"""Checkpoints a run can trust: atomic writes, finding a config's newest run, and checking a checkpoint fits a config.

What ``--ckpt_path`` does to the run (a resume continues the *same* run, in its folder), as the CLI applies it:
:func:`open_run` before anything is built, :func:`check_resumed` once the learner and the Trainer are.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from cl_lightning.contract import step_numbers
from cl_lightning.lightning_compat import checkpoint_logged_steps, set_purge_step
from cl_lightning.run.runfolder import hold

_VERSION = re.compile(r"version_(\d+)")
TEMP_MARK = ".tmp"  # a checkpoint being written is ``<name>.ckpt.tmp<pid>`` beside its target


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: missing, truncated, foreign, or built with other hyperparameters."""


@dataclass
class Resume:
    """Where a run resumes: its ``version_N`` folder (``None``: a new one), checkpoint path and loaded contents."""

    run: Path | None
    path: Path | None
    checkpoint: dict[str, Any] | None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O with crash-safe local writes: temporary file, ``fsync``, then ``os.replace``
    (atomic), so a ``kill -9`` leaves the previous checkpoint intact and a stray ``*.ckpt.tmp<pid>``
    (:func:`remove_temp_files`). Remote paths (``s3://`` …) go through Lightning's own writer."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically (local paths)."""
        if "://" in str(path) or storage_options is not None:
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f"{target.name}{TEMP_MARK}{os.getpid()}")
        try:
            with open(temp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        _fsync_folder(target.parent)


def _fsync_folder(folder: Path) -> None:
    """Make a rename durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_temp_files(folder: Path) -> None:
    """Delete half-written checkpoints (``*.ckpt.tmp<pid>``) a killed run left in ``folder``."""
    for path in list(folder.glob(f"*.ckpt{TEMP_MARK}*")):
        path.unlink(missing_ok=True)


def version_of(run: Path) -> int | str:
    """The logger ``version`` of a run folder: ``N`` of ``version_N``, else the folder's name (e.g. ``seed_0``)."""
    match = _VERSION.fullmatch(run.name)
    return int(match.group(1)) if match else run.name


def logger_arguments(config: Any) -> Any:
    """The ``init_args`` of a parsed config's logger (TensorBoard or CSV), ``None`` without one."""
    logger = config.trainer.get("logger")
    return logger.get("init_args") if hasattr(logger, "get") else None


def experiment_dir(config: Any) -> Path | None:
    """``<save_dir>/<name>`` of a parsed config's logger, the parent of its runs."""
    init = logger_arguments(config)
    if init is None or init.get("save_dir") is None:
        return None
    return Path(init.save_dir) / (init.get("name") or "lightning_logs")


def configured_run(config: Any, experiment: Path) -> Path | None:
    """The run folder a parsed config's logger names with an explicit ``version`` (``seed_0``, ``3``), if it exists."""
    version = logger_arguments(config).get("version")
    if version is None:
        return None
    folder = experiment / (f"version_{version}" if isinstance(version, int) else str(version))
    return folder if folder.is_dir() else None


def newest_run(experiment: Path, checkpointed: bool = False) -> Path | None:
    """The ``version_N`` folder with the highest ``N`` under a logger's ``<save_dir>/<name>`` (``checkpointed``: of
    those that hold a checkpoint), if any."""
    runs = [p for p in experiment.glob("version_*") if p.is_dir() and _VERSION.fullmatch(p.name)]
    runs = [p for p in runs if not checkpointed or last_checkpoint(p) is not None]
    return max(runs, key=version_of) if runs else None


def last_checkpoint(run: Path) -> Path | None:
    """``checkpoints/last.ckpt`` of a run folder, else its newest ``*.ckpt``, else ``None``; of ``last.ckpt`` and the
    ``last-vN.ckpt`` Lightning writes beside it (e.g. after the run folder moved), the most finished."""
    folder = run / "checkpoints"
    lasts = sorted(p for p in folder.glob("last*.ckpt") if p.is_file())
    if len(lasts) > 1:
        return max(lasts, key=lambda p: tasks_done(p) or 0)  # a damaged file loses to any readable one
    if lasts:
        return lasts[0]
    found = [p for p in folder.glob("*.ckpt") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def tasks_done(checkpoint: Path | dict[str, Any]) -> int | None:
    """The tasks a checkpoint (its path, or its loaded contents) holds finished (its epoch + 1); ``None`` where it
    cannot be read."""
    try:
        return int((read_checkpoint(checkpoint) if isinstance(checkpoint, Path) else checkpoint)["epoch"]) + 1
    except (KeyError, TypeError, ValueError):  # ValueError: CheckpointError too
        return None


def kept_checkpoint(trainer: Trainer) -> str:
    """The checkpoint a run kept last (its ``last.ckpt``, else its best), ``""`` if none."""
    callback = trainer.checkpoint_callback
    return getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "")


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Open a checkpoint memory-mapped on the CPU (cheap however large), or raise one clear :class:`CheckpointError`."""
    if path.is_dir():
        inside = last_checkpoint(path) or last_checkpoint(path.parent)
        hint = f"; its checkpoint: --ckpt_path {inside}" if inside is not None else "; it holds no checkpoint"
        raise CheckpointError(f"--ckpt_path {path}: a folder, not a checkpoint file{hint}")
    if not path.is_file():
        raise CheckpointError(f"--ckpt_path {path}: no such file")
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError … for a damaged file
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        first = first if len(first) <= 120 else first[:120].rpartition(" ")[0] + " …"  # never cut mid-word
        raise CheckpointError(
            f"--ckpt_path {path}: not a readable checkpoint (truncated or not written by torch.save: {first})"
        ) from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint or "loops" not in checkpoint:
        raise CheckpointError(f"--ckpt_path {path}: not a Lightning training checkpoint (no state_dict or loop state)")
    return checkpoint


def find_resume(config: Any, subcommand: str) -> Resume | None:
    """What ``--ckpt_path`` of a parsed subcommand config continues, checked to open (``None``: nothing to resume).

    ``last``: the newest checkpoint of the run the logger's ``version`` names, else of its newest ``version_N`` (a
    ``fit`` of a run killed before its first checkpoint starts it over in its folder). A checkpoint of another
    config's run starts a new run. Sets ``config.ckpt_path`` to the file (or ``None``).

    Raises:
        CheckpointError: Nothing to resume, or a checkpoint that does not open.
    """
    given = str(config.get("ckpt_path"))
    if config.get("ckpt_path") is None or given in ("best", "hpc") or given.startswith("registry"):
        return None  # nothing, or Lightning's own meanings
    experiment = experiment_dir(config)
    if given == "last":
        if experiment is None:
            raise CheckpointError("--ckpt_path last needs a logger with a save_dir (it looks for <save_dir>/<name>/)")
        run = configured_run(config, experiment) or newest_run(experiment)
        if run is None:
            raise CheckpointError(f"--ckpt_path last: no run under {experiment}/ to resume; start one without it")
        path = last_checkpoint(run)
        older = newest_run(experiment, checkpointed=True) if path is None else None
        if path is None and (older is not None or subcommand != "fit"):
            # a folder without a checkpoint (a fit killed before its first task ended, or an evaluation run of an
            # older version) never hides a run that has one: say which, rather than start anything over
            found = f"; {older} has one: --ckpt_path {last_checkpoint(older)}" if older is not None else ""
            raise CheckpointError(f"--ckpt_path last: the newest run, {run}, has no checkpoint{found}")
        if path is None:  # killed before its first checkpoint: start that run over, in its own folder
            config.ckpt_path = None
            sys.stderr.write(f"--ckpt_path last: {run} has no checkpoint yet; starting that run over in its folder\n")
            return Resume(run, None, None)
    else:
        path = Path(given)
    checkpoint = read_checkpoint(path)
    folder = path.resolve().parent  # ``<run>/checkpoints`` for a run's checkpoint
    run = folder.parent
    if folder.name != "checkpoints" or experiment is None or run.parent != experiment.resolve():
        run = None  # not a run's, or another config's run: this one starts a new version
    config.ckpt_path = str(path)
    return Resume(run, path, checkpoint)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys; tuples as lists (a YAML round trip turns one into the other)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): list(value) if isinstance(value, tuple) else value}


def keyword_defaults(cls: type) -> dict[str, Any]:
    """Each keyword argument's default along ``cls``'s classes (the nearest class's wins)."""
    out: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        try:
            parameters = inspect.signature(init).parameters.values() if init is not None else ()
        except (TypeError, ValueError):
            continue
        for parameter in parameters:
            if parameter.default is not inspect.Parameter.empty:
                default = parameter.default  # a tuple as a list, as :func:`_flatten` writes it
                out.setdefault(parameter.name, list(default) if isinstance(default, tuple) else default)
    return out


def hparam_differences(
    saved: dict[str, Any],
    current: dict[str, Any],
    prefix: str = "",
    ignore: tuple[str, ...] = (),
    defaults: dict[str, Any] | None = None,
) -> list[str]:
    """What differs between a checkpoint's hyperparameters and the config's, as ``key: checkpoint X, config Y``
    (``prefix`` before each key). A different learner class is the one difference reported; ``_instantiator`` and
    the dotted keys in ``ignore`` are left out, and so is a key the checkpoint lacks whose config value is its
    default (``defaults``: an option added since, left alone)."""
    a = {k: v for k, v in _flatten(dict(saved)).items() if not k.startswith("_instantiator") and k not in ignore}
    b = {k: v for k, v in _flatten(dict(current)).items() if not k.startswith("_instantiator") and k not in ignore}
    if a.get("_class_path") != b.get("_class_path"):  # another learner: its options are beside the point
        old, new = (str(d.get("_class_path", "?")).rpartition(".")[2] for d in (a, b))
        return [f"the checkpoint is a {old}, the config asks for a {new}"]
    missing, defaults = object(), defaults or {}
    out = []
    for key in sorted(a.keys() | b.keys(), key=lambda k: (k != "_class_path", k)):
        old, new = a.get(key, missing), b.get(key, missing)
        if old != new and not (old is missing and key in defaults and new == defaults[key]):
            show = lambda v: "(absent)" if v is missing else repr(v)  # noqa: E731
            out.append(f"{prefix}{key}: checkpoint {show(old)}, config {show(new)}")
    return out


def weight_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why a checkpoint's weights cannot load into a learner (missing, extra or reshaped tensors), else ``None``."""
    missing, extra = sorted(current.keys() - saved.keys()), sorted(saved.keys() - current.keys())
    shapes = [k for k in sorted(current.keys() & saved.keys()) if tuple(saved[k].shape) != tuple(current[k].shape)]
    if shapes:
        k = shapes[0]
        return f"weight {k} has shape {list(saved[k].shape)} in the checkpoint, {list(current[k].shape)} here"
    if missing or extra:
        return f"the weights differ ({len(missing)} missing, e.g. {(missing or extra)[0]}; {len(extra)} unexpected)"
    return None


def check_resume(
    checkpoint: dict[str, Any], path: Path | None, model: LightningModule, data: dict[str, Any] | None, accept: bool
) -> bool:
    """Refuse (:class:`CheckpointError`) a checkpoint that does not fit the config; True when it resumes with changes.

    Another learner class or weights of other shapes never resume; other hyperparameters, or another ``data``
    (the config's, ``None`` to skip; more tasks or another ``steps_per_batch`` are fine), only with ``accept``.
    """
    saved, current = (dict(h) for h in (checkpoint.get("hyper_parameters", {}), model.hparams))
    for hparams in (saved, current):  # step engines that compute the same numbers bit for bit compare alike
        if "step_kernel" in hparams:
            hparams["step_kernel"] = step_numbers(hparams["step_kernel"])
    differences = hparam_differences(saved, current, defaults=keyword_defaults(type(model)))
    record = checkpoint.get("callbacks", {}).get(DataRecord.__qualname__, {}).get("data")
    if record is not None and data is not None:
        from cl_lightning.data import StreamDataModule  # the data module's own options and their defaults

        # more tasks, or chunks batched otherwise (the same numbers at the same logging steps), are no difference
        ignore, defaults = ("stream.init_args.num_tasks", "steps_per_batch"), keyword_defaults(StreamDataModule)
        differences += hparam_differences(record, data, "data.", ignore, defaults)
    other_class = bool(differences) and differences[0].startswith("the checkpoint is a")
    mismatch = None if other_class else weight_mismatch(checkpoint["state_dict"], model.state_dict())
    if other_class or mismatch:
        listed = "; ".join([*differences[:1], *([mismatch] if mismatch else [])])
        raise CheckpointError(
            f"--ckpt_path {path} cannot be resumed with this config: {listed}. Use the config it was trained with, "
            "or start a new run without --ckpt_path"
        )
    if differences and not accept:
        raise CheckpointError(
            f"--ckpt_path {path} does not match the config: {'; '.join(differences)}. "
            "Fix the config, or pass --accept_changed_hparams true to resume with the config's values"
        )
    return bool(differences)


class DataRecord(Callback):
    """Keeps the run's ``data`` config in its checkpoints, so a resume can check it regenerates the same stream.

    Args:
        data: The ``data`` section of the resolved config.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def state_dict(self) -> dict[str, Any]:
        """The data config, stored under ``checkpoint["callbacks"]["DataRecord"]``."""
        return {"data": self.data}


class ConfigOptimizerValues(Callback):
    """After a resume with accepted changes, the config's optimiser values (``lr`` …, kept in the optimiser's
    ``defaults``) replace those Lightning restored into its param groups; the state (moments, steps) is kept."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Copy each optimiser's configured values into its restored param groups."""
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group.update({k: v for k, v in optimizer.defaults.items() if k in group and k != "params"})


def open_run(config: Any, subcommand: str) -> Resume | None:
    """The run and checkpoint ``--ckpt_path`` continues (``None``: none given); a ``fit`` locks that run's folder
    (:func:`~cl_lightning.run.runfolder.hold`, on global rank 0: Lightning starts a DDP run's other ranks as copies of
    the command, whose rank its environment gives) and logs into it, its ``version_N`` set in ``config``'s logger."""
    resume = find_resume(config, subcommand)
    if subcommand in ("validate", "test"):
        evaluation_folder(config, subcommand, resume)
        # it restores the learner only: the checkpoint's DataRecord (fit's resume check) and ModelCheckpoint's folder
        # (an evaluation writes no checkpoint) do not matter to it; another callback missing still warns
        for message in (r".*add the following callbacks: \['DataRecord'\]", r".*The dirpath has changed from .*"):
            warnings.filterwarnings("ignore", message=message)
    if resume is not None and resume.run is not None and subcommand == "fit":
        if rank_zero_only.rank == 0:  # before anything is written into it; a DDP run's other ranks write nothing there
            hold(resume.run)
        config.trainer.logger.init_args.version = version_of(resume.run)
        # ModelCheckpoint warns that the folder holds checkpoints: here that is the point
        warnings.filterwarnings("ignore", message=".*Checkpoint directory .* exists and is not empty.*")
    return resume


def evaluation_folder(config: Any, subcommand: str, resume: Resume | None) -> None:
    """Log a ``validate`` / ``test`` into ``<run>/<subcommand>_K`` when it evaluates a run's checkpoint, else into
    ``<save_dir>/<name>/<subcommand>_K``, never a new ``version_N`` that ``--ckpt_path last`` would take (a logger
    ``version`` the user set is kept, unless it names the evaluated run); say what it evaluates without a checkpoint.
    """
    if resume is None or resume.checkpoint is None:
        sys.stderr.write(
            f"{subcommand}: no --ckpt_path, so this evaluates the config's untrained learner (its initial weights); "
            f"--ckpt_path last evaluates the newest fit of this config\n"
        )
    experiment = experiment_dir(config)
    if experiment is None:
        return
    init = logger_arguments(config)
    run = resume.run if resume is not None else None
    if run is None and init.get("version") is not None and configured_run(config, experiment) is None:
        return  # a folder of the user's own choosing
    parent = run if run is not None else experiment
    taken = {p.name for p in parent.glob(f"{subcommand}_*")} if parent.is_dir() else set()
    name = next(f"{subcommand}_{k}" for k in range(len(taken) + 1) if f"{subcommand}_{k}" not in taken)
    init.version = f"{run.name}/{name}" if run is not None else name


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
