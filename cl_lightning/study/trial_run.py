"""One trial of a :mod:`cl_lightning.study.sweep`: its state, an attempt at its ``fit`` in a child process, its record.

A trial is finished when its ``fit`` exited 0 and its events reached the last task; ``trial.json`` records that and
every attempt (wall and CPU time, peak memory, exit code, host, command). A finished trial that kept its checkpoint
is extended when its suite later asks for more tasks (:func:`extends`): it resumes from that checkpoint. ``trial.lock``
(:mod:`cl_lightning.run.runfolder`) keeps a second sweep off a trial one is running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from cl_lightning.errors import UsageError
from cl_lightning.run.runfolder import RunInUse, hold, release
from cl_lightning.run.threads import sweep_threads
from cl_lightning.study.childproc import die_with_parent, wait_passing_signals
from cl_lightning.study.suite import Trial

FINISHED = "finished"
STOPPED = "stopped"
TRIAL_LOCK = "trial.lock"
STOP_REQUEST = "stop.request"  # written into a trial folder by a stopping sweep on Ray (request_stop)
_STOP_CODES = (143, 130, -signal.SIGTERM, -signal.SIGINT)  # a fit stopped by SIGTERM / SIGINT


def _last_task(log_dir: Path) -> tuple[int | None, int | None]:
    """(last task the events reached, number of tasks the run's config asks for); None where unknown."""
    from cl_lightning.study.report import read_scalars, stream_tasks

    config = log_dir / "config.yaml"
    wanted = stream_tasks(yaml.safe_load(config.read_text()) or {})[0] if config.exists() else None
    epochs = read_scalars(log_dir, tags=("epoch",)).get("epoch", {})
    return (int(max(epochs.values())) if epochs else None), wanted


NUM_TASKS_ARGS = ("--data.stream.init_args.num_tasks=", "--data.stream.num_tasks=")


def asked_tasks(trial: Trial) -> int | None:
    """The stream length the trial's own arguments ask for (the last ``num_tasks`` override; ``None``: none)."""
    asked = None
    for arg in trial.args:
        for prefix in NUM_TASKS_ARGS:
            if arg.startswith(prefix):
                asked = int(arg.removeprefix(prefix))
    return asked


def extends(trial: Trial, record: dict[str, Any], log_dir: Path) -> bool:
    """Whether a finished trial is to be extended: its arguments ask for more tasks than it finished with.

    Raises:
        UsageError: When it is, but its checkpoint is gone (finished trials keep none unless kept on purpose).
    """
    asked, done = asked_tasks(trial), record.get("num_tasks")
    if record.get("status") != FINISHED or asked is None or done is None or asked <= int(done):
        return False
    if resume_point(log_dir) is None:
        raise UsageError(
            f"{trial.name}/seed_{trial.seed} finished {done} tasks and its suite now asks for {asked}, but its "
            f"checkpoint was removed: it cannot be extended (run it anew as another experiment, or ask for {done})"
        )
    return True


def trial_state(trial: Trial, root: str | Path) -> str:
    """``finished``, ``extend`` (finished, resumed for more tasks), ``resume`` (a checkpoint to continue from) or
    ``new``."""
    log_dir = trial.log_dir(root)
    record = _record(log_dir)
    if record.get("status") == FINISHED:
        return "extend" if extends(trial, record, log_dir) else FINISHED
    return "resume" if resume_point(log_dir) is not None else "new"


def _record(log_dir: Path) -> dict[str, Any]:
    """The trial's record (``trial.json``; empty before its first attempt)."""
    path = log_dir / "trial.json"
    return json.loads(path.read_text()) if path.exists() else {}


def resume_point(log_dir: Path) -> Path | None:
    """The checkpoint a trial resumes from, as ``fit --ckpt_path last`` would take it
    (:func:`~cl_lightning.run.checkpointing.last_checkpoint`); ``None``: it starts anew."""
    from cl_lightning.run.checkpointing import last_checkpoint  # Lightning only when a trial runs

    return last_checkpoint(log_dir)


def run_trial(trial: Trial, root: str, threads: int | None = None, cwd: str | None = None) -> dict[str, Any]:
    """Run (or resume, or skip) one trial in a child process (output: ``fit.log``); return its record (``trial.json``).

    Args:
        trial: The trial.
        root: Log root (absolute when the trial may run in another working directory, as on Ray).
        threads: ``OMP_NUM_THREADS`` of a new trial's child (None: the user's thread variable, else one); an
            unfinished trial keeps the count it started with (:func:`trial_threads`).
        cwd: Working directory of the child, where relative config paths resolve (None: this process's).
    """
    log_dir = trial.log_dir(root)
    record = _record(log_dir)
    if record.get("status") == FINISHED and not extends(trial, record, log_dir):
        return record | {"skipped": True}
    try:
        hold(log_dir, TRIAL_LOCK)  # another sweep running this trial: leave it to that one
    except RunInUse as busy:
        return {**asdict(trial), "status": "in use", "skipped": True, "reason": str(busy)}
    try:
        if (log_dir / STOP_REQUEST).exists():  # queued on Ray when the sweep was stopped
            return {**asdict(trial), "status": STOPPED, "skipped": True, "reason": "the sweep was stopped"}
        return _attempt(trial, root, threads, cwd)
    finally:
        (log_dir / STOP_REQUEST).unlink(missing_ok=True)
        release(log_dir, TRIAL_LOCK)


def request_stop(trial: Trial, root: str | Path) -> None:
    """Ask the process running (or about to run) the trial to stop its fit, wherever it runs (a file in the trial
    folder, which :func:`run_trial` polls: a signal to the sweep cannot reach a Ray worker's children)."""
    log_dir = trial.log_dir(root)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / STOP_REQUEST).touch()


def _attempt(trial: Trial, root: str, threads: int | None, cwd: str | None) -> dict[str, Any]:
    """Run the trial's fit once (or skip it, finished meanwhile) and record the attempt in ``trial.json``."""
    log_dir = trial.log_dir(root)
    record = _record(log_dir)
    if record.get("status") == FINISHED and not extends(trial, record, log_dir):  # finished by another sweep
        return record | {"skipped": True}
    ckpt = resume_point(log_dir)  # once: with several last*.ckpt it opens each
    if ckpt is None:  # a fresh start: drop the events of an attempt that died before its first checkpoint
        for stale in log_dir.glob("events.out.tfevents.*"):
            stale.unlink()
    argv = [sys.executable, "-m", "cl_lightning", *trial.fit_args(root, ckpt)]
    env = dict(os.environ)
    threads = trial_threads(record, threads, env)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    start = time.time()
    with open(log_dir / "fit.log", "a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, preexec_fn=die_with_parent
        )
        status, usage = wait_passing_signals(proc, log_dir / STOP_REQUEST)
    proc.returncode = os.waitstatus_to_exitcode(status)
    attempt = {
        "start": start,
        "wall_seconds": time.time() - start,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # kilobytes on Linux
        "returncode": proc.returncode,
        "resumed_from": str(ckpt) if ckpt else None,
        "threads": threads,
        "host": socket.gethostname(),
        "command": argv,
    }
    if proc.returncode != 0:  # why, in the fit's own words: its error line (or its last line)
        attempt |= {"error": _error_line(log_dir / "fit.log"), "log": str(log_dir / "fit.log")}
    last, wanted = _last_task(log_dir)
    done = proc.returncode == 0 and last is not None and (wanted is None or last == wanted - 1)
    record = {
        **asdict(trial),
        "status": FINISHED if done else STOPPED if proc.returncode in _STOP_CODES else "unfinished",
        "threads": threads,
        "last_task": last,
        "num_tasks": wanted,
        "attempts": [*record.get("attempts", []), attempt],
    }
    (log_dir / "trial.json").write_text(json.dumps(record, indent=1))
    return record


def trial_threads(record: dict[str, Any], threads: int | None, environ: dict[str, str]) -> int:
    """The intra-op threads of a trial's next attempt: the count it started with, whatever this sweep would choose.

    The thread count changes how products sum, so an unfinished trial keeps it (``trial.json``'s ``threads``). A
    trial recorded before counts were (its attempts ran under the one-thread default of #35) keeps one. A new trial
    takes ``threads`` (a sweep's cores per trial), else the user's thread variable in ``environ``, else one
    (:func:`~cl_lightning.run.threads.sweep_threads`).
    """
    if "threads" in record:
        return int(record["threads"])
    if record.get("attempts"):
        return 1
    return threads or sweep_threads(environ)


def _error_line(fit_log: Path) -> str:
    """The last attempt's ``error:`` line in ``fit.log`` (else its last line), for the sweep's console."""
    try:
        text = fit_log.read_text(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.rpartition("\n$ ")[2].splitlines()[1:] if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1][:300]
