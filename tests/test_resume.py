"""A run a user can trust: divergence stops it, `--ckpt_path` continues the same run, `kill -9` at any moment loses
nothing but time (resumed == uninterrupted, one TensorBoard run), and checkpoint writes are atomic."""

from __future__ import annotations

import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from helpers import BACKPROP, CBP, EWC, FULL_ATTENTION, KNN, MAML, PARAMETRIC, QOA, ROOT, tiny_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cl_lightning.run.checkpointing import AtomicCheckpointIO, hparam_differences, read_checkpoint
from cl_lightning.run.cli import main

CHECKPOINTS = ["--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_last=true"]
SGD = ["--model=cl_lightning.learners.Backprop", "--model.hidden_sizes=[32, 32]", "--model.optimizer=torch.optim.SGD"]


def _run(root: Path) -> Path:
    return root / "logs" / "tiny" / "version_0"


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve of a run folder as TensorBoard reads it (time-based cost/* left out)."""
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    tags = [t for t in events.Tags()["scalars"] if not t.startswith("cost/")]
    return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in tags}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Two good tasks, then lr 1e6 from task 2 on: exit 1, a message naming task, step and cause, last.ckpt kept."""
    main(["fit", *tiny_args(tmp_path, [*SGD, "--model.optimizer.lr=0.01"], tasks=2, extra=CHECKPOINTS)])
    last = _run(tmp_path) / "checkpoints" / "last.ckpt"
    before = _digest(last)
    capsys.readouterr()
    diverging = [*SGD, "--model.optimizer.lr=1e6"]
    resume = [*CHECKPOINTS, "--ckpt_path=last", "--accept_changed_hparams=true"]
    with pytest.raises(SystemExit) as stop:
        main(["fit", *tiny_args(tmp_path, diverging, tasks=3, extra=resume)])
    assert stop.value.code == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1
    assert "training diverged in task 2 (step 35 of the run)" in err[0]  # 2 tasks of 16 chunks, then the 3rd step
    assert "learning rate too high for Backprop (lr 1e+06)" in err[0]
    assert f"the last good checkpoint is {last}" in err[0]
    assert _digest(last) == before
    assert read_checkpoint(last)["epoch"] == 1


def test_diverging_run_without_a_checkpoint_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["fit", *tiny_args(tmp_path, [*SGD, "--model.optimizer.lr=1e6"], tasks=2)])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "training diverged in task 0 (step 3 of the run)" in err
    assert f"no checkpoint was written before it; its logs up to there are in {_run(tmp_path)}" in err
    assert "Traceback" not in err


def test_resume_continues_the_same_run_folder_and_curves(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """2 tasks, then `--ckpt_path last` to 4 tasks: one version_0 folder, one curve per metric, steps increasing."""
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=2, extra=CHECKPOINTS)])
    capsys.readouterr()
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=4, extra=[*CHECKPOINTS, "--ckpt_path=last"])])
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "logs" / "tiny").iterdir()) == ["version_0"]
    curves = _scalars(_run(tmp_path))
    steps = [step for step, _ in curves["eval/forward_acc"]]
    assert steps == [15, 31, 47, 63]  # the last step of each task
    assert [step for step, _ in curves["eval/backward_acc"]] == [31, 47, 63]
    summary = out.strip().splitlines()[-3:]  # the run's summary is the last thing printed
    assert summary[0].startswith("Run finished: 4/4 tasks")
    assert re.fullmatch(r"Last task: forward acc [\d.]+, backward acc [\d.]+ \(task t − 1\)\.", summary[1])
    assert f"checkpoint: {_run(tmp_path)}/checkpoints/last.ckpt" in summary[2]


@pytest.mark.parametrize("command", ["validate", "test"])
def test_an_evaluation_never_shadows_the_run_last_resumes(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture
) -> None:
    """#35: `validate` / `test` used to open a new version_N without a checkpoint, and a later `fit --ckpt_path last`
    picked that folder and trained from scratch (exit 0, no message). They log beside the run they evaluate now,
    and `last` continues the fit."""
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=2, extra=CHECKPOINTS)])
    with warnings.catch_warnings(record=True) as caught:
        main([command, *tiny_args(tmp_path, BACKPROP, tasks=2, extra=[*CHECKPOINTS, "--ckpt_path=last"])])
    noise = [str(w.message) for w in caught if "DataRecord" in str(w.message) or "dirpath" in str(w.message)]
    assert noise == []  # fit's callback state and checkpoint folder are nothing to an evaluation
    capsys.readouterr()
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=3, extra=[*CHECKPOINTS, "--ckpt_path=last"])])
    assert "Run finished: 3/3 tasks" in capsys.readouterr().out
    assert [step for step, _ in _scalars(_run(tmp_path))["eval/forward_acc"]] == [15, 31, 47]  # continued, not anew
    main([command, *tiny_args(tmp_path, BACKPROP, tasks=3, extra=[*CHECKPOINTS, "--ckpt_path=last"])])
    assert sorted(p.name for p in (tmp_path / "logs" / "tiny").iterdir()) == ["version_0"]
    assert sorted(p.name for p in _run(tmp_path).glob(f"{command}_*")) == [f"{command}_0", f"{command}_1"]


def test_an_evaluation_without_a_checkpoint_says_what_it_evaluates(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`test` without --ckpt_path evaluates the untrained learner: one line says so, and its logs are `test_0`."""
    main(["test", *tiny_args(tmp_path, BACKPROP, tasks=2)])
    err = capsys.readouterr().err
    assert "test: no --ckpt_path, so this evaluates the config's untrained learner" in err
    assert sorted(p.name for p in (tmp_path / "logs" / "tiny").iterdir()) == ["test_0"]


def test_last_never_starts_over_a_folder_without_checkpoint_when_an_older_run_has_one(tmp_path: Path) -> None:
    """A newest version_N without a checkpoint (e.g. left by an older `validate`) hides no run: refused, named."""
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=2, extra=CHECKPOINTS)])
    (tmp_path / "logs" / "tiny" / "version_1").mkdir()
    with pytest.raises(SystemExit) as refused:
        main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=3, extra=[*CHECKPOINTS, "--ckpt_path=last"])])
    assert refused.value.code == 2
    assert not any((tmp_path / "logs" / "tiny" / "version_1").iterdir())


def test_a_named_run_folder_resumes_into_itself(tmp_path: Path) -> None:
    """A run folder named by the user (as `sweep` does: `seed_0`) is continued like a `version_N` one."""
    named = [*CHECKPOINTS, "--trainer.logger.version=seed_0"]
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=2, extra=named)])
    run = tmp_path / "logs" / "tiny" / "seed_0"
    main(
        [
            "fit",
            *tiny_args(tmp_path, BACKPROP, tasks=3, extra=[*CHECKPOINTS, f"--ckpt_path={run}/checkpoints/last.ckpt"]),
        ]
    )
    assert sorted(p.name for p in run.parent.iterdir()) == ["seed_0"]
    assert [step for step, _ in _scalars(run)["eval/forward_acc"]] == [15, 31, 47]


def test_last_restarts_a_run_that_has_no_checkpoint_in_its_own_folder(tmp_path: Path) -> None:
    """A run killed before its first checkpoint (here: one that wrote none) is started over in the same folder,
    and TensorBoard shows one run: the old curves are purged from step 0."""
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=2, extra=["--trainer.enable_checkpointing=false"])])
    first = _scalars(_run(tmp_path))
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=2, extra=[*CHECKPOINTS, "--ckpt_path=last"])])
    assert sorted(p.name for p in (tmp_path / "logs" / "tiny").iterdir()) == ["version_0"]
    assert len(list(_run(tmp_path).glob("events.out.tfevents.*"))) == 2
    assert _scalars(_run(tmp_path)) == first


def test_enable_checkpointing_false_turns_the_checkpoint_slot_off(tmp_path: Path) -> None:
    """A config's checkpoint slot gives way to ``--trainer.enable_checkpointing=false`` (Lightning itself refuses the
    pair, and the message used to be blamed on trainer.accelerator): the run trains and writes no checkpoint."""
    slot = [
        "--callbacks.checkpoint=lightning.pytorch.callbacks.ModelCheckpoint",
        "--callbacks.checkpoint.save_last=true",
    ]
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=1, extra=[*slot, "--trainer.enable_checkpointing=false"])])
    assert _scalars(_run(tmp_path))["eval/forward_acc"]
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_checkpoint_written_before_an_option_existed_resumes_at_its_default(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A checkpoint from before the data module had ``lags`` (every run before the lifelong studies moved in) resumes
    when the config leaves the option at its default, and is refused when the config sets it."""
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=1, extra=CHECKPOINTS)])
    last = _run(tmp_path) / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=False)
    record = next(v for k, v in checkpoint["callbacks"].items() if "DataRecord" in k)
    del record["data"]["lags"]
    del checkpoint["hyper_parameters"]["seed"]  # a learner option added later, alike
    torch.save(checkpoint, last)
    with pytest.raises(SystemExit):
        main(
            [
                "fit",
                *tiny_args(tmp_path, BACKPROP, tasks=2, extra=[*CHECKPOINTS, "--ckpt_path=last", "--data.lags=[1]"]),
            ]
        )
    assert "data.lags: checkpoint (absent), config [1]" in capsys.readouterr().err
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=2, extra=[*CHECKPOINTS, "--ckpt_path=last"])])
    assert [step for step, _ in _scalars(_run(tmp_path))["eval/forward_acc"]] == [15, 31]


def test_accepted_changes_use_the_config_values(tmp_path: Path) -> None:
    """`--accept_changed_hparams`: the config's learning rate replaces the one restored from the checkpoint."""
    main(["fit", *tiny_args(tmp_path, [*SGD, "--model.optimizer.lr=0.01"], tasks=1, extra=CHECKPOINTS)])
    extra = [*CHECKPOINTS, "--ckpt_path=last", "--accept_changed_hparams=true"]
    cli = main(["fit", *tiny_args(tmp_path, [*SGD, "--model.optimizer.lr=0.002"], tasks=2, extra=extra)])
    assert cli.trainer.optimizers[0].param_groups[0]["lr"] == 0.002
    saved = read_checkpoint(_run(tmp_path) / "checkpoints" / "last.ckpt")
    assert saved["optimizer_states"][0]["param_groups"][0]["lr"] == 0.002


def _as_written_before_engines(path: Path) -> None:
    """Rewrite a Backprop checkpoint as the code before step engines wrote it: hyperparameter ``step_kernel``
    ``"torch"``, the optimiser steps counted by Lightning's automatic loop (Backprop optimised automatically)."""
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["hyper_parameters"]["step_kernel"] = "torch"
    loop = checkpoint["loops"]["fit_loop"]
    manual = loop["epoch_loop.manual_optimization.optim_step_progress"]
    automatic = loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]
    for tracker in ("total", "current"):
        steps = manual[tracker]["completed"]
        automatic["step"][tracker] = {"ready": steps, "completed": steps}
        automatic["zero_grad"][tracker] = {"ready": steps, "completed": steps, "started": steps}
        manual[tracker] = {"ready": 0, "completed": 0}
    torch.save(checkpoint, path)


def test_a_checkpoint_written_before_step_engines_resumes_exactly(tmp_path: Path) -> None:
    """``step_kernel: torch`` and an automatic step count (a run of the code before engines): it resumes with the
    default engine without ``--accept_changed_hparams``; weights and ``global_step`` equal an uninterrupted run's,
    the curves those of the same resumes from a checkpoint of this code, and a second resume still counts right."""
    straight = main(["fit", *tiny_args(tmp_path / "straight", BACKPROP, tasks=4, extra=CHECKPOINTS)])
    runs = {}
    for root, legacy in ((tmp_path / "new", False), (tmp_path / "old", True)):
        main(["fit", *tiny_args(root, BACKPROP, tasks=2, extra=CHECKPOINTS)])
        if legacy:
            _as_written_before_engines(_run(root) / "checkpoints" / "last.ckpt")
        for tasks in (3, 4):  # more tasks change the probe tasks: curves compared between the two folders
            runs[legacy] = main(
                ["fit", *tiny_args(root, BACKPROP, tasks=tasks, extra=[*CHECKPOINTS, "--ckpt_path=last"])]
            )
    resumed = runs[True]
    assert resumed.model.hparams["step_kernel"] == "autograd"
    assert resumed.trainer.global_step == runs[False].trainer.global_step == straight.trainer.global_step == 64
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert _scalars(_run(tmp_path / "old")) == _scalars(_run(tmp_path / "new"))


def test_hparam_differences_lists_each_changed_value() -> None:
    saved = {"_class_path": "a.B", "hidden": (3, 4), "optimizer": {"init_args": {"lr": 0.1}}, "_instantiator": "x"}
    same = {"_class_path": "a.B", "hidden": [3, 4], "optimizer": {"init_args": {"lr": 0.1}}}
    assert hparam_differences(saved, same) == []
    changed = {"_class_path": "a.B", "hidden": [3], "optimizer": {"init_args": {"lr": 0.2}}, "seed": 1}
    assert hparam_differences(saved, changed) == [
        "hidden: checkpoint [3, 4], config [3]",
        "optimizer.init_args.lr: checkpoint 0.1, config 0.2",
        "seed: checkpoint (absent), config 1",
    ]
    assert hparam_differences(saved, {"_class_path": "a.C"}) == ["the checkpoint is a B, the config asks for a C"]


def test_atomic_write_leaves_the_old_checkpoint_when_the_write_fails(tmp_path: Path) -> None:
    """A write that dies half-way (here: an object torch.save cannot pickle) leaves the previous file intact."""
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": torch.tensor(1)}, path)
    with pytest.raises(Exception, match="pickle"):
        io.save_checkpoint({"step": torch.tensor(2), "bad": lambda: None}, path)
    assert torch.load(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def _start(root: Path, learner: list[str], resume: bool) -> subprocess.Popen:
    extra = [*CHECKPOINTS, *(["--ckpt_path=last"] if resume else [])]
    cmd = [sys.executable, "-m", "cl_lightning", "fit", *tiny_args(root, learner, tasks=3, extra=extra)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_during_checkpoint_write(proc: subprocess.Popen, folder: Path) -> bool:
    """SIGKILL the moment a temporary checkpoint file exists; True if that happened before the run ended."""
    while proc.poll() is None:
        if folder.is_dir() and any(".ckpt.tmp" in name for name in os.listdir(folder)):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
    return False


def _kill_at_random(proc: subprocess.Popen, run: Path, rng: random.Random) -> None:
    """SIGKILL at a random moment of training or evaluation (after the run folder exists)."""
    while proc.poll() is None and not list(run.glob("events.out.tfevents.*")):
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 1.5))
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def assert_kills_then_resume_equal_uninterrupted(tmp_path: Path, learner: list[str], random_kills: int = 2) -> None:
    """One kill during a checkpoint write, `random_kills` kills at random moments, each followed by
    `--ckpt_path last`; the final curves equal an uninterrupted run's and there is one run folder."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the killed runs' count (_start): on some CPUs two threads sum products in another order
    try:
        main(["fit", *tiny_args(tmp_path / "straight", learner, tasks=3, extra=CHECKPOINTS)])
    finally:
        torch.set_num_threads(threads)
    expected = _scalars(_run(tmp_path / "straight"))
    root = tmp_path / "killed"
    root.mkdir()
    run, rng = _run(root), random.Random(0)
    caught, random_kills_landed = False, 0
    for attempt in range(1 + random_kills + 5):
        proc = _start(root, learner, resume=attempt > 0)
        if not caught:
            caught = _kill_during_checkpoint_write(proc, run / "checkpoints")
            assert caught or proc.returncode == 0, proc.stderr.read()[-2000:]
        elif attempt <= random_kills:
            _kill_at_random(proc, run, rng)
            random_kills_landed += proc.returncode == -signal.SIGKILL
        else:
            assert proc.wait() == 0, proc.stderr.read()[-2000:]
        if proc.returncode == 0:
            if not caught:  # the run ended before a write was caught: start it over
                continue
            break
    assert caught, "no kill landed during a checkpoint write"
    assert random_kills_landed >= 1, "every run ended before its random kill"
    assert proc.returncode == 0
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]
    assert not list((run / "checkpoints").glob("*.tmp*"))
    assert _scalars(run) == expected


def _default_optimizer(learner: list[str]) -> list[str]:
    """A learner's test arguments less its optimiser and inner-loop settings (its own defaults then apply)."""
    return [a for a in learner if not a.startswith(("--model.optimizer", "--model.inner_lr"))]


KILL_LEARNERS = {
    "backprop": BACKPROP,
    "qoa": QOA,
    "cbp": CBP,
    "ewc": _default_optimizer(EWC),
    "knn": KNN,
    "full_attention": _default_optimizer(FULL_ATTENTION),
    "maml_replay": _default_optimizer(MAML),
    "parametric_attention": _default_optimizer(PARAMETRIC),
}


@pytest.mark.slow  # ~70 s on 2 busy cores: five subprocess starts
def test_kill_9_at_random_moments_then_resume_equals_uninterrupted(tmp_path: Path) -> None:
    assert_kills_then_resume_equal_uninterrupted(tmp_path, BACKPROP, random_kills=1)


@pytest.mark.slow
@pytest.mark.parametrize("learner", sorted(KILL_LEARNERS))
def test_kill_9_many_times_every_learner(tmp_path: Path, learner: str) -> None:
    assert_kills_then_resume_equal_uninterrupted(tmp_path, KILL_LEARNERS[learner], random_kills=3)


@pytest.mark.slow
def test_kill_9_during_warmup_then_resume_equals_uninterrupted(tmp_path: Path) -> None:
    """2 warm-up tasks of 3: the kills land in the warm-up epochs (which evaluate nothing) or just after."""
    assert_kills_then_resume_equal_uninterrupted(tmp_path, [*BACKPROP, "--data.stream.warmup_tasks=2"], random_kills=1)


def test_last_is_the_most_finished_of_lightnings_versioned_last_checkpoints(tmp_path: Path) -> None:
    """Lightning writes ``last-v1.ckpt`` beside a ``last.ckpt`` it did not write itself (its callback state was not
    restored, e.g. after the run folder moved): ``last`` is the checkpoint of the most finished tasks, not the name."""
    from cl_lightning.run.checkpointing import last_checkpoint

    folder = tmp_path / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save({"epoch": 7}, folder / "last-v1.ckpt")
    torch.save({"epoch": 3}, folder / "last.ckpt")
    assert last_checkpoint(tmp_path / "version_0") == folder / "last-v1.ckpt"
    (folder / "last-v1.ckpt").unlink()
    assert last_checkpoint(tmp_path / "version_0") == folder / "last.ckpt"


def test_resuming_a_finished_run_says_so_and_cites_its_scores(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`fit --ckpt_path last` on a run that already ran all its tasks trains nothing: the summary says so and cites
    the scores the checkpoint holds (the forgetting monitor's curves and R), not "finished in 0 min 0 s"."""
    monitor = ["--callbacks.forgetting=cl_lightning.callbacks.ForgettingMonitor", "--callbacks.forgetting.plot=false"]
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=3, extra=[*CHECKPOINTS, *monitor])])
    first = capsys.readouterr().out.strip().splitlines()[-3:]
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=3, extra=[*CHECKPOINTS, *monitor, "--ckpt_path=last"])])
    again = capsys.readouterr().out.strip().splitlines()[-3:]
    assert re.fullmatch(r"Run finished: 3/3 tasks in 0 min \d+ s\.", first[0]), first[0]
    assert again[0] == "Run already finished: 3/3 tasks; nothing left to run."
    assert re.search(r"; ACC [\d.]+ \(probe tasks, R's last row\)\.$", first[1]), first[1]
    assert again[1:] == first[1:]  # the same scores, from the checkpoint; the same folders
