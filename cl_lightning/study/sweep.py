"""Run a suite: ``python -m cl_lightning sweep configs/suites/X.yaml`` (the file format:
:mod:`cl_lightning.study.suite`).

Every trial is a ``python -m cl_lightning fit`` in its own process (:mod:`cl_lightning.study.trial_run`); a re-run
skips the finished trials and resumes the others; a SIGTERM / SIGINT stops the running fits and starts no further
trial. Trials run on Ray when it is installed (one per GPU, or per ``--cpus-per-trial`` cores; on a cluster the
suite folder must be on a file system every node sees), else one after another.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from cl_lightning.errors import OneLineParser, UsageError
from cl_lightning.study import childproc
from cl_lightning.study.childproc import passing_signals, received
from cl_lightning.study.suite import Suite, Trial, check_seeds, load_suite
from cl_lightning.study.trial_run import FINISHED, STOP_REQUEST, request_stop, resume_point, run_trial, trial_state


def _describe(record: dict[str, Any]) -> str:
    name = f"{record['name']}/seed_{record['seed']}"
    if record.get("skipped"):
        return f"{name}: {record.get('reason') or 'already finished'}, skipped"
    a = record["attempts"][-1]
    how = "resumed" if a["resumed_from"] else "ran"
    why = f"; {a['error']} (the whole output: {a['log']})" if a.get("error") else ""
    return (
        f"{name}: {record['status']} ({how} {a['wall_seconds']:.0f} s, {a['cpu_seconds']:.0f} s CPU,"
        f" peak {a['peak_rss_bytes'] / 2**30:.2f} GiB, exit {a['returncode']}, last task {record['last_task']}){why}"
    )


def run_sequential(trials: Sequence[Trial], root: str) -> list[dict[str, Any]]:
    """Run the trials one after another on this machine."""
    records = []
    for i, trial in enumerate(trials):
        if received() is not None:
            break
        print(f"[{i + 1}/{len(trials)}] {trial.name}/seed_{trial.seed} ({trial_state(trial, root)})", flush=True)
        records.append(run_trial(trial, root))
        print("    " + _describe(records[-1]), flush=True)
    return records


REACH_SECONDS = 10.0
"""How long ``--address host:port`` may take to answer before the sweep gives up on it."""


def connect_ray(address: str | None) -> None:
    """Start or join Ray (``address``: ``None`` starts a local one, ``auto`` joins the one running here, ``host:port``
    a head there), or raise :class:`UsageError` with Ray's reason in one line; a ``host:port`` that does not answer
    within :data:`REACH_SECONDS` is refused before Ray waits on it for minutes."""
    import ray  # optional dependency

    if address and address != "auto" and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "localhost", int(port)), timeout=REACH_SECONDS).close()
        except (OSError, ValueError) as error:
            raise UsageError(
                f"--address {address}: no Ray head answers there ({error}); start one with `ray start --head` "
                "or leave out --address to run a Ray of this machine's own"
            ) from None
    catching = childproc.catching()
    env = {"env_vars": {"PYTHONPATH": childproc.package_pythonpath()}}  # the workers import this package
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, runtime_env=env)
    except (ConnectionError, RuntimeError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"--address {address}: Ray could not connect: {reason}") from None
    if catching:
        childproc.catch_signals()  # ray.init replaced the SIGTERM handler of passing_signals


def run_on_ray(trials: Sequence[Trial], root: str, address: str | None, cpus: int, gpus: float) -> list[dict[str, Any]]:
    """Run the trials as Ray tasks, each holding ``cpus`` cores and ``gpus`` GPUs while it runs (joining Ray first
    unless :func:`connect_ray` did)."""
    import ray  # optional dependency

    if not ray.is_initialized():
        connect_ray(address)
    try:
        remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(run_trial)
        root, cwd, stopping = str(Path(root).resolve()), str(Path.cwd()), False
        pending = {remote.remote(t, root, cpus, cwd): t for t in trials}
        records = []
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)  # a timeout lets a signal through
            if received() is not None and not stopping:  # the fits stop between two steps; their records come in
                stopping = True
                for t in pending.values():
                    request_stop(t, root)
            if not ready:
                continue
            trial = pending.pop(ready[0])
            try:
                records.append(ray.get(ready[0]))
                print(_describe(records[-1]), flush=True)
            except Exception as err:  # a trial's worker died: report it, keep the others going
                print(f"{trial.name}/seed_{trial.seed}: failed on Ray: {err}", flush=True)
        return records
    finally:
        ray.shutdown()


def _ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m cl_lightning sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("suite", help="suite file, e.g. configs/suites/pmnist_cpu.yaml")
    p.add_argument("--root", default="logs", help="log root; trials go to <root>/<suite>/<experiment>/seed_<s>")
    p.add_argument("--only", nargs="+", metavar="EXPERIMENT", help="run only these experiments of the suite")
    p.add_argument("--seeds", nargs="+", type=int, help="run these seeds instead of the suite's")
    p.add_argument(
        "--fit-args",
        default="",
        help='extra arguments for every fit, after the suite\'s (e.g. "--data.stream.init_args.num_tasks=5")',
    )
    p.add_argument("--address", help="Ray head to join (e.g. ray://host:10001 or auto); default: start Ray here")
    p.add_argument("--cpus-per-trial", type=int, default=1, help="cores per trial on Ray (and its thread count)")
    p.add_argument("--gpus-per-trial", type=float, help="GPUs per trial on Ray (default: 1 when CUDA is visible)")
    p.add_argument("--no-ray", action="store_true", help="run trials one after another even if Ray is installed")
    p.add_argument("--dry-run", action="store_true", help="print each trial's state and command, run nothing")
    return p


def _run(trials: Sequence[Trial], opts: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the trials on Ray when it is installed (unless ``--no-ray``), else one after another, passing signals on."""
    with passing_signals():
        if _ray_available() and not opts.no_ray:
            gpus = opts.gpus_per_trial
            if gpus is None:
                import torch

                gpus = 1.0 if torch.cuda.is_available() else 0.0
            return run_on_ray(trials, opts.root, opts.address, opts.cpus_per_trial, gpus)
        return run_sequential(trials, opts.root)


def _selected(suite: Suite, opts: argparse.Namespace) -> list[Trial]:
    """The suite's trials with ``--seeds`` and ``--fit-args`` applied, those of ``--only`` (each must exist)."""
    if opts.seeds:
        check_seeds(opts.seeds, "--seeds")
        runs = list(dict.fromkeys((t.name, t.configs, t.args) for t in suite.trials))
        suite.trials = [Trial(suite.name, n, s, c, a) for n, c, a in runs for s in opts.seeds]
    if opts.fit_args:
        suite.trials = [replace(t, args=(*t.args, *shlex.split(opts.fit_args))) for t in suite.trials]
    names = list(dict.fromkeys(t.name for t in suite.trials))
    unknown = " ".join(n for n in opts.only or [] if n not in names)
    if unknown:
        raise UsageError(f"--only {unknown}: no such experiment in {opts.suite}; choose from: {', '.join(names)}")
    return [t for t in suite.trials if not opts.only or t.name in opts.only]


def _joined_fit_args(argv: Sequence[str]) -> list[str]:
    """``--fit-args '--data…'`` as ``--fit-args=--data…``: argparse takes a value starting with ``-`` for an option."""
    out, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        out.append(f"{arg}={rest.pop(0)}" if arg == "--fit-args" and rest else arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m cl_lightning sweep``; returns 1 when a trial is left unfinished, else 0."""
    opts = _parser().parse_args(_joined_fit_args(sys.argv[1:] if argv is None else argv))
    suite = load_suite(opts.suite)
    trials = _selected(suite, opts)
    suite_dir = Path(opts.root) / suite.name
    if opts.dry_run:  # writes nothing
        for t in trials:
            state = trial_state(t, opts.root)
            ckpt = resume_point(t.log_dir(opts.root)) if state in ("resume", "extend") else None
            print(f"{t.name}/seed_{t.seed} [{state}]: python -m cl_lightning {' '.join(t.fit_args(opts.root, ckpt))}")
        return 0
    todo = [t for t in trials if trial_state(t, opts.root) != FINISHED]
    if _ray_available() and not opts.no_ray and todo:
        connect_ray(opts.address)  # before anything is written: a cluster that is not there writes nothing
    suite_dir.mkdir(parents=True, exist_ok=True)
    (suite_dir / "suite.yaml").write_text(yaml.safe_dump(suite.summary(opts.suite), sort_keys=False))
    if not opts.no_ray and not _ray_available():
        print(
            "Ray is not installed: trials run one after another. For several at once (one per GPU or per"
            ' --cpus-per-trial cores, or on a cluster with --address), pip install "cl-lightning[sweep]".',
            flush=True,
        )
    for t in todo:  # left by a sweep killed while it was stopping
        (t.log_dir(opts.root) / STOP_REQUEST).unlink(missing_ok=True)
    print(f"suite {suite.name}: {len(trials)} trials, {len(todo)} to run, logs in {suite_dir}", flush=True)
    for t in trials:
        if t not in todo:
            print(f"{t.name}/seed_{t.seed}: already finished, skipped", flush=True)
    records = _run(todo, opts) if todo else []
    left = sum(r.get("status") != FINISHED for r in records) + len(todo) - len(records)
    if left == len(trials):  # nothing to report on
        print(f"suite {suite.name}: none of {len(trials)} trials finished (their errors are above)", flush=True)
    else:
        print(f"suite {suite.name}: {len(trials) - left} of {len(trials)} trials finished; report:", flush=True)
        print(f"  python -m cl_lightning report {suite_dir}", flush=True)
    signum = received()
    if signum is not None:
        print(f"stopped by {signal.Signals(signum).name}: run the same command again to resume", flush=True)
        return 128 + signum
    return min(left, 1)
