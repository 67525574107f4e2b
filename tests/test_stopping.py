"""Stops a run survives: SIGTERM / SIGINT at any moment stop it between two steps (exit 143 / 130, one line saying
how to resume, no partial checkpoint; while the CLI is still being imported too), the resume equals an uninterrupted
run, a signal once the run has finished changes nothing (exit 0, one line), a sweep records and resumes a stopped
trial, and a run folder has one writer at a time, whatever happened to the previous one."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import BACKPROP, ROOT, tiny_args
from test_resume import CHECKPOINTS, _run, _scalars
from test_sweep import _curve_n, _suite

from cl_lightning.run import process_signals
from cl_lightning.run.checkpointing import CheckpointError, read_checkpoint
from cl_lightning.run.cli import main
from cl_lightning.run.runfolder import LOCK_NAME, RunInUse, Snapshot, hold, release
from cl_lightning.run.stopping import GracefulStop, resume_command
from cl_lightning.study.suite import load_suite
from cl_lightning.study.sweep import main as sweep_main
from cl_lightning.study.sweep import run_sequential
from cl_lightning.study.trial_run import FINISHED, STOPPED

TASKS = 10  # a tiny run of ~2 s
KEEP = [*CHECKPOINTS, "--trainer.logger.default_hp_metric=false"]  # (TensorBoard's placeholder, once per start)
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
WITH_TESTS = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}  # signal_callback importable


def _fit(root: Path, tasks: int, resume: bool) -> subprocess.Popen:
    extra = [*KEEP, *(["--ckpt_path=last"] if resume else [])]
    cmd = [sys.executable, "-m", "cl_lightning", "fit", *tiny_args(root, BACKPROP, tasks=tasks, extra=extra)]
    return subprocess.Popen(cmd, cwd=root, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(condition: Callable[[], object], timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition() and time.time() < deadline:
        time.sleep(0.02)
    assert condition(), "timed out"


def _own_events(run: Path, proc: subprocess.Popen) -> list[Path]:
    """The event files ``proc`` wrote (TensorBoard names them ``events.out.tfevents.<time>.<host>.<pid>.<n>``)."""
    return [p for p in run.glob("events.out.tfevents.*") if p.name.split(".")[-2] == str(proc.pid)]


def test_resume_command_replaces_the_checkpoint_argument() -> None:
    given = ["fit", "--config", "a b.yaml", "--ckpt_path", "x.ckpt", "--ckpt_path=y.ckpt", "--seed_everything=1"]
    assert resume_command(given) == (
        "python -m cl_lightning fit --config 'a b.yaml' --seed_everything=1 --ckpt_path last"
    )


def test_a_held_run_refuses_a_second_holder_and_is_free_after_release(tmp_path: Path) -> None:
    """Two holders in one process use two open files, as two processes do: the second is refused."""
    hold(tmp_path)
    try:
        code = "from cl_lightning.run.runfolder import hold; import sys; hold(__import__('pathlib').Path(sys.argv[1]))"
        other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=ENV, capture_output=True, text=True)
        assert other.returncode == 1
        assert f"is being written by another process (pid {os.getpid()})" in other.stderr
    finally:
        release(tmp_path)
    assert not (tmp_path / LOCK_NAME).exists()
    hold(tmp_path)  # free again
    release(tmp_path)


def test_a_failed_attempt_is_undone(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "tiny" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("old")
    snapshot = Snapshot(run)
    (run / "config.yaml").write_text("new")
    (run / "events.out.tfevents.1.h.2.0").write_bytes(b"x" * 163)
    (run / "hparams.yaml").write_text("{}")
    snapshot.undo()
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == ["checkpoints", "config.yaml"]
    assert (run / "config.yaml").read_text() == "old"
    new = tmp_path / "new" / "tiny" / "version_0"
    fresh = Snapshot(new)
    new.mkdir(parents=True)
    fresh.undo()
    assert not (tmp_path / "new").exists()
    with pytest.raises(RunInUse):  # (RunInUse is a usage error: one line, exit 2)
        raise RunInUse("x")


def _tasks_done(run: Path) -> int:
    """The finished tasks the run's newest checkpoint holds (0 before the first; written atomically, so never torn)."""
    try:
        return int(read_checkpoint(run / "checkpoints" / "last.ckpt")["epoch"]) + 1
    except CheckpointError:
        return 0


def _stop_in_task(proc: subprocess.Popen, run: Path, task: int, signum: int) -> str:
    """Send ``signum`` once the run is in task ``task`` (0-based): its newest checkpoint holds ``task`` finished
    tasks, or more, and it has started writing (its own event file). Return its stderr."""
    _wait_for(lambda: proc.poll() is not None or (_own_events(run, proc) and _tasks_done(run) >= task))
    if proc.poll() is None:
        proc.send_signal(signum)
    return proc.communicate()[1]


def _assert_stopped(proc: subprocess.Popen, err: str, signum: int) -> bool:
    """A stopped fit: exit 128 + signal, one line saying where and how to resume, no error, no traceback."""
    if proc.returncode == 0:  # finished before the signal
        return False
    assert proc.returncode == 128 + signum, err
    name = signal.Signals(signum).name
    lines = [line for line in err.splitlines() if line.startswith("stopped by")]
    assert len(lines) == 1, err
    resumable = r"; .* resume with python -m cl_lightning fit .* --ckpt_path last"
    undone = r", before its first step: nothing was written; start it again with python -m cl_lightning fit .*"
    assert re.fullmatch(rf"stopped by {name} at task \d+ of {TASKS}({resumable}|{undone})", lines[0]), lines[0]
    assert "Traceback" not in err, err
    assert "error:" not in err, err
    return True


@pytest.mark.slow  # ~1-2 min on 2 busy cores: one process start per attempt
def test_sigterm_and_sigint_at_random_moments_then_resume_equals_uninterrupted(tmp_path: Path) -> None:
    """Each attempt is signalled in a task drawn in advance (seeded, printed), watching the run's checkpoints: the
    signals never land after the run has finished, however slow or loaded the machine (a time after the start did).
    Task 0 is signalled once the run starts writing, so it may stop before its first step."""
    main(["fit", *tiny_args(tmp_path / "straight", BACKPROP, tasks=TASKS, extra=KEEP)])
    expected = _scalars(_run(tmp_path / "straight"))
    root = tmp_path / "stopped"
    root.mkdir()
    run, seed = _run(root), 0
    signals = [signal.SIGTERM, signal.SIGINT, signal.SIGTERM, signal.SIGTERM]
    tasks = sorted(random.Random(seed).sample(range(TASKS - 2), len(signals)))  # two tasks or more left after each
    draw = f"seed {seed}: signals in tasks {tasks} (0-based) of {TASKS}"
    print(draw)  # noqa: T201 - pytest shows it with a failure: the draw to reproduce
    stops = 0
    for signum, task in zip(signals, tasks, strict=True):
        proc = _fit(root, tasks=TASKS, resume=run.exists())  # (a stop before the first step leaves no run folder)
        err = _stop_in_task(proc, run, task, signum)
        stops += _assert_stopped(proc, err, signum)
        assert not list(run.rglob("*.tmp*")), "a partial checkpoint"
        if proc.returncode == 0:
            break
    else:
        proc = _fit(root, tasks=TASKS, resume=True)
        assert proc.wait() == 0, proc.stderr.read()
    assert stops >= 2, f"the signals landed after the runs finished; {draw}"
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]
    assert not (run / LOCK_NAME).exists()
    assert _scalars(run) == expected


def test_a_signal_while_starting_goes_to_the_run_and_one_after_it_finished_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    """The handlers ``python -m cl_lightning fit`` puts around the CLI's own, in this process (the ``atexit``
    callback is kept here and called by hand)."""
    at_exit: list[Callable[[], None]] = []
    monkeypatch.setattr(process_signals.atexit, "register", at_exit.append)
    previous = {signum: signal.getsignal(signum) for signum in process_signals.SIGNALS}
    try:
        process_signals.watch()
        os.kill(os.getpid(), signal.SIGINT)  # while the CLI is imported: recorded, taken over by GracefulStop
        stop = GracefulStop()
        stop.install()
        os.kill(os.getpid(), signal.SIGTERM)  # the first signal is kept
        assert stop.signum == signal.SIGINT
        stop.restore()

        stop = GracefulStop()  # a run that finished untouched
        stop.install()
        stop.restore()
        stop.finished()
        assert capfd.readouterr().err == ""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):  # one line, then nothing
            os.kill(os.getpid(), signum)
        assert capfd.readouterr().err == process_signals.finished_message(signal.SIGTERM)

        stop = GracefulStop()  # a run that received a signal after its last step: answered when it finished
        stop.install()
        os.kill(os.getpid(), signal.SIGINT)
        stop.restore()
        assert capfd.readouterr().err == ""
        stop.finished()
        assert capfd.readouterr().err == process_signals.finished_message(signal.SIGINT)

        (ignore,) = at_exit
        ignore()  # the interpreter's shutdown, where Python resets its own handlers to the default: ignored
        assert all(signal.getsignal(signum) == signal.SIG_IGN for signum in process_signals.SIGNALS)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _fit_to_files(root: Path, extra: list[str]) -> subprocess.Popen:
    """A 3-task ``fit`` writing its stdout and stderr to ``root/out.txt`` and ``root/err.txt`` (a pipe nobody reads
    while the test sends signals could fill up)."""
    cmd = [sys.executable, "-m", "cl_lightning", "fit", *tiny_args(root, BACKPROP, tasks=3, extra=[*KEEP, *extra])]
    with (root / "out.txt").open("w") as out, (root / "err.txt").open("w") as err:
        return subprocess.Popen(cmd, cwd=root, env=WITH_TESTS, stdout=out, stderr=err)


def _mapped(pid: int, library: str) -> bool:
    """Whether process ``pid`` has loaded ``library`` (Linux: ``/proc/<pid>/maps``)."""
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.slow  # ~10-20 s: one process start per signal
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_after_the_run_finished_is_one_line_and_exit_0(tmp_path: Path, signum: int) -> None:
    """One signal right after the last step (the log has said "`Trainer.fit` stopped", Lightning's teardown is to
    come), then one a millisecond from the end of ``Trainer.fit`` until the process is gone (the summary, the CLI
    putting back its handlers, ``atexit``, the interpreter's shutdown). The run is complete, so: exit 0, one line."""
    marker = tmp_path / "fit_ended"
    late = [
        "--trainer.callbacks+=signal_callback.SignalAfterFit",
        f"--trainer.callbacks.signum={int(signum)}",
        f"--trainer.callbacks.marker={marker}",
    ]
    proc = _fit_to_files(tmp_path, late)
    _wait_for(lambda: proc.poll() is not None or marker.exists())
    sent, deadline = 0, time.time() + 300
    while proc.poll() is None and time.time() < deadline:  # (exited but not yet reaped by poll: still takes one)
        os.kill(proc.pid, signum)
        sent += 1
        time.sleep(0.001)
    if proc.poll() is None:
        proc.kill()
        pytest.fail(f"still running 300 s after the end of fit, {sent} signals later")
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert proc.returncode == 0, f"exit {proc.returncode} after {sent} signals from the end of fit:\n{err}"
    said = [line for line in err.splitlines() if "arrived after the run had finished" in line]
    assert said == [process_signals.finished_message(signum).strip()], err
    assert "Traceback" not in err, err
    assert "stopped by" not in err, err
    assert sent > 0, "the process exited before the test could signal it"
    assert "Run finished: 3/3 tasks" in out, out
    run = _run(tmp_path)
    assert _tasks_done(run) == 3
    assert not (run / LOCK_NAME).exists()


@pytest.mark.slow  # ~10-20 s: one process start per signal
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="watches /proc/<pid>/maps")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_cli_is_imported_stops_the_run_before_its_first_step(tmp_path: Path, signum: int) -> None:
    """Sent once the process has loaded libtorch: torch, Lightning and the CLI are still being imported (seconds),
    before the CLI installs its handlers. As for a signal during config parsing: exit 128 + signal, one line, no
    run folder."""
    proc = _fit_to_files(tmp_path, [])
    _wait_for(lambda: proc.poll() is not None or _mapped(proc.pid, "libtorch"))
    assert proc.poll() is None, (tmp_path / "err.txt").read_text()
    proc.send_signal(signum)
    proc.wait(timeout=300)
    err = (tmp_path / "err.txt").read_text()
    assert proc.returncode == 128 + signum, f"exit {proc.returncode}:\n{err}"
    lines = [line for line in err.splitlines() if line.startswith("stopped by")]
    name = signal.Signals(signum).name
    start_again = "before its first step: nothing was written; start it again with python -m cl_lightning fit "
    assert len(lines) == 1, err
    assert lines[0].startswith(f"stopped by {name} at task 1 of 3, {start_again}"), err
    assert "Traceback" not in err, err
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow  # ~1-2 min: four process starts
def test_two_resumes_at_once_one_proceeds_and_a_kill_9_frees_the_run(tmp_path: Path) -> None:
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=1, extra=CHECKPOINTS)])
    run = _run(tmp_path)
    a, b = _fit(tmp_path, tasks=2000, resume=True), _fit(tmp_path, tasks=2000, resume=True)
    _wait_for(lambda: a.poll() is not None or b.poll() is not None)
    loser, winner = (a, b) if a.poll() is not None else (b, a)
    err = loser.communicate()[1]
    assert loser.returncode == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    assert f"{run.resolve()} is being written by another process (pid {winner.pid})" in errors[0]
    assert "Traceback" not in err
    assert winner.poll() is None  # still training
    _wait_for(lambda: _own_events(run, winner))
    assert not _own_events(run, loser)
    winner.send_signal(signal.SIGKILL)
    winner.wait()
    assert (run / LOCK_NAME).exists()  # left behind by the killed process: it must not block
    after = _fit(tmp_path, tasks=2000, resume=True)
    _wait_for(lambda: after.poll() is not None or _own_events(run, after))
    assert after.poll() is None, after.communicate()[1]
    after.send_signal(signal.SIGTERM)
    err = after.communicate()[1]
    assert after.returncode == 143, err
    assert "error:" not in err


@pytest.mark.slow  # ~1-2 min
def test_a_stopped_sweep_records_the_trial_stopped_and_the_next_sweep_resumes_it(tmp_path: Path) -> None:
    suite = _suite(tmp_path, [0], tasks=40, experiments=("b",))
    root = tmp_path / "logs"
    b_dir = root / "toy" / "b" / "seed_0"
    cmd = [sys.executable, "-m", "cl_lightning", "sweep", str(suite), "--root", str(root), "--no-ray"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(lambda: (b_dir / "checkpoints" / "last.ckpt").exists())
    time.sleep(0.5)  # a few more tasks
    proc.send_signal(signal.SIGTERM)  # to the sweep alone: it passes the signal on to the running fit
    out = proc.communicate()[0]
    assert proc.returncode == 143, out
    assert "stopped by SIGTERM: run the same command again to resume" in out
    record = json.loads((b_dir / "trial.json").read_text())
    assert record["status"] == STOPPED
    assert record["attempts"][-1]["returncode"] == 143
    assert "stopped by SIGTERM at task" in (b_dir / "fit.log").read_text()

    assert sweep_main([str(suite), "--root", str(root), "--no-ray"]) == 0
    record = json.loads((b_dir / "trial.json").read_text())
    assert record["status"] == FINISHED
    assert record["attempts"][-1]["resumed_from"].endswith("last.ckpt")
    assert not (b_dir / "trial.lock").exists()
    assert not (b_dir / LOCK_NAME).exists()
    straight = load_suite(suite).trials[0]
    run_sequential([straight], str(tmp_path / "straight"))
    for tag in ("eval/forward_acc", "eval/backward_acc", "train/online_acc"):
        resumed, whole = _curve_n(b_dir, tag), _curve_n(straight.log_dir(tmp_path / "straight"), tag)
        np.testing.assert_array_equal(resumed, whole)
    assert yaml.safe_load((b_dir / "config.yaml").read_text())["trainer"]["max_epochs"] == 40


SLOW = pytest.mark.slow  # ~5-10 s each: one process start; the other cases cover the same code


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=SLOW)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_as_the_last_task_closes_is_the_finished_run_it_is(tmp_path: Path, signum: int) -> None:
    """A signal in the last task after its final evaluation (Lightning's fit loop checks for SIGTERM once more as it
    closes the task, when every file is written): the run is complete, so exit 0, its summary, one line."""
    extra = ["--trainer.callbacks+=signal_callback.SignalAtLastTaskEnd", f"--trainer.callbacks.signum={int(signum)}"]
    proc = _fit_to_files(tmp_path, extra)
    assert proc.wait(timeout=300) == 0, (tmp_path / "err.txt").read_text()
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert "Run finished: 3/3 tasks" in out, out
    said = [line for line in err.splitlines() if "arrived after the run had finished" in line]
    assert said == [process_signals.finished_message(signum).strip()], err
    assert "stopped by" not in err, err
    run = _run(tmp_path)
    assert _tasks_done(run) == 3
    assert (run / "hparams.yaml").exists()


@pytest.mark.parametrize(
    ("command", "signum"),
    [
        ("validate", signal.SIGTERM),
        ("test", signal.SIGINT),
        pytest.param("validate", signal.SIGINT, marks=SLOW),
        pytest.param("test", signal.SIGTERM, marks=SLOW),
    ],
    ids=["validate-SIGTERM", "test-SIGINT", "validate-SIGINT", "test-SIGTERM"],
)
def test_a_signal_stops_validate_and_test_with_its_exit_code_and_one_line(
    tmp_path: Path, command: str, signum: int
) -> None:
    """``validate`` / ``test`` are stopped at their next batch as ``fit`` is (they used to run on after SIGINT, and
    end with exit 0 after SIGTERM), and say that their scores are incomplete."""
    extra = ["--trainer.callbacks+=signal_callback.SignalAtEvaluation", f"--trainer.callbacks.signum={int(signum)}"]
    cmd = [sys.executable, "-m", "cl_lightning", command, *tiny_args(tmp_path, BACKPROP, tasks=3, extra=extra)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=WITH_TESTS, capture_output=True, text=True, timeout=300)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"{command} stopped by {name} before its last batch: its scores are incomplete; run the same command again"
    )
    assert "Traceback" not in proc.stderr
    assert "acc" not in proc.stdout  # no results table


def test_the_stop_line_starts_below_the_progress_bar(tmp_path: Path) -> None:
    """With the progress bar on (a terminal's default), the stop's line is a line of its own, not glued to the bar's
    (stdout and stderr into one file, as a terminal shows them)."""
    extra = [*KEEP, "--trainer.enable_progress_bar=true", "--trainer.callbacks+=signal_callback.SignalInTask"]
    extra += ["--trainer.callbacks.signum=15", "--trainer.callbacks.task=1"]
    cmd = [sys.executable, "-m", "cl_lightning", "fit", *tiny_args(tmp_path, BACKPROP, tasks=3, extra=extra)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=WITH_TESTS, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = proc.stdout.decode().replace("\r", "\n").splitlines()
    assert proc.returncode == 128 + signal.SIGTERM, lines[-5:]
    assert any(line.startswith("stopped by SIGTERM at task 2 of 3; ") for line in lines), lines[-5:]
