from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import CONFIGS, ROOT

from cl_lightning.data import StreamDataModule
from cl_lightning.learners import ContinualLearner
from cl_lightning.run.cli import main

EXPERIMENTS = sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("quick"))


@pytest.mark.parametrize("config", EXPERIMENTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("quick", [False, True], ids=["paper", "quick"])
def test_every_config_instantiates(config: Path, quick: bool, tmp_path: Path) -> None:
    args = ["--config", str(config)] + (["--config", str(CONFIGS / "quick.yaml")] if quick else [])
    cli = main([*args, f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    assert isinstance(cli.model, ContinualLearner)
    assert isinstance(cli.datamodule, StreamDataModule)
    assert cli.trainer.max_epochs == cli.datamodule.num_tasks
    if quick:
        assert cli.datamodule.num_tasks == 30
    assert cli.model.input_shape == cli.datamodule.input_shape
    assert cli.model.task_type == cli.datamodule.task_type
    assert cli.trainer.logger.name == config.stem


@pytest.mark.parametrize("config", ["qoa_pmnist.yaml", "qoa_v2_pmnist.yaml"])
def test_quick_qoa_overlay(config: str, tmp_path: Path) -> None:
    args = ["--config", str(CONFIGS / config), "--config", str(CONFIGS / "quick_demo.yaml")]
    cli = main(
        [*args, "--config", str(CONFIGS / "quick_qoa.yaml"), f"--trainer.logger.init_args.save_dir={tmp_path}"],
        run=False,
    )
    stream, model = cli.datamodule.stream, cli.model
    assert (model.support_size, model.queries_per_step, model.sampler, model.use_labels) == (200, 10, "window", False)
    assert model.buffer.capacity == stream.train_size  # one task: task t - 5 has left it
    assert cli.trainer.max_epochs == stream.num_tasks == 60
    assert stream.chunk_size == 100
    assert cli.datamodule.context_size == 200


def test_quick_maml_overlay_fills_its_buffer_within_the_quick_run(tmp_path: Path) -> None:
    args = ["--config", str(CONFIGS / "maml_replay_pmnist.yaml"), "--config", str(CONFIGS / "quick.yaml")]
    cli = main(
        [*args, "--config", str(CONFIGS / "quick_maml.yaml"), f"--trainer.logger.init_args.save_dir={tmp_path}"],
        run=False,
    )
    stream, model = cli.datamodule.stream, cli.model
    admitted_per_task = stream.train_size * model.admission_prob
    assert model.buffer.capacity / admitted_per_task <= stream.num_tasks / 3  # full within the first third
    assert model.update_prob == 0.2
    assert model.start_when_full


def test_max_epochs_must_match_the_stream(tmp_path: Path) -> None:
    cli = main(
        [
            "--config",
            str(CONFIGS / "bp_pmnist.yaml"),
            "--config",
            str(CONFIGS / "quick.yaml"),
            "--trainer.max_epochs=3",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
        ],
        run=False,
    )
    with pytest.raises(ValueError, match="max_epochs"):
        cli.trainer.fit(cli.model, cli.datamodule)


def test_cli_fit_end_to_end(tmp_path: Path) -> None:
    """`python -m cl_lightning fit` on a shrunken paper config: event files, config.yaml and a checkpoint."""
    cmd = [
        sys.executable,
        "-m",
        "cl_lightning",
        "fit",
        "--config",
        str(CONFIGS / "bp_pmnist.yaml"),
        "--config",
        str(CONFIGS / "quick.yaml"),
        "--data.stream.init_args.num_tasks=3",
        "--data.stream.init_args.train_size=1200",
        "--data.stream.init_args.query_size=100",
        "--data.backward_lag=1",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.callbacks+=cl_lightning.callbacks.HessianMonitor",  # torch.func.jvp: no FutureWarning shown
        "--trainer.callbacks.every_n_tasks=1",
        "--trainer.callbacks.num_queries=50",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Warning" not in out.stderr, out.stderr[-3000:]  # no deprecation notices
    assert "Tip:" not in out.stdout + out.stderr  # no advertisements
    summary = out.stdout.strip().splitlines()[-3:]  # the run's summary is the last thing printed
    assert re.fullmatch(r"Run finished: 3/3 tasks in 0 min \d+ s\.", summary[0]), summary[0]
    scores = (
        r"Last 3 tasks \(mean\): forward acc [\d.]+, backward acc [\d.]+ \(task t − 1, 2 tasks\); "
        r"ACC [\d.]+ \(probe tasks, R's last row\)\."
    )
    assert re.fullmatch(scores, summary[1]), summary[1]
    assert summary[2].startswith(f"Logs: {tmp_path}/bp_pmnist/version_0")
    run = tmp_path / "bp_pmnist" / "version_0"
    assert (run / "config.yaml").exists()
    assert list(run.glob("events.out.tfevents.*"))
    assert (run / "checkpoints" / "last.ckpt").exists()
    assert "Task 3/3" in out.stdout + out.stderr
    assert "run_eta" in out.stdout + out.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/online_acc", "train/loss", "eval/forward_acc", "eval/backward_acc"} <= tags
    assert {"eval/acc_matrix/task_0", "eval/acc_matrix/task_2"} <= tags
    assert "hessian/eff_rank" in tags
    assert len(events.Scalars("eval/forward_acc")) == 3
    assert len(events.Scalars("eval/backward_acc")) == 2
    assert all(0 <= e.value <= 1 for e in events.Scalars("eval/forward_acc"))


def test_unknown_learner_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(CONFIGS / "bp_pmnist.yaml"), "--model=NoSuchLearner"], run=False)
    assert exit_info.value.code != 0
    assert "NoSuchLearner" in capsys.readouterr().err


def test_run_summary_cites_last_ten_task_means_and_acc() -> None:
    """The summary's scores line: means of the monitor's last evaluated tasks, the backward lag, ACC named ACC."""
    import torch

    from cl_lightning.run.summary import run_summary

    logged = {"eval/forward_acc": torch.tensor(0.5), "forgetting/avg": torch.tensor(0.75)}
    trainer = SimpleNamespace(
        current_epoch=1005,
        max_epochs=1005,
        interrupted=False,
        lightning_module=SimpleNamespace(metric_name="acc"),
        datamodule=SimpleNamespace(backward_lags=[5]),
        callback_metrics=logged,
        checkpoint_callback=None,
        logger=None,
    )
    recent = {"forward": (0.8125, 10), "backward": (0.796875, 10)}
    assert run_summary(trainer, 125.0, recent) == (
        "\nRun finished: 1005/1005 tasks in 2 min 5 s.\n"
        "Last 10 tasks (mean): forward acc 0.8125, backward acc 0.7969 (task t − 5); ACC 0.75 (probe tasks, R's "
        "last row).\nno checkpoint kept.\n"
    )
    trainer.datamodule.backward_lags = [1, 2, 3, 4, 5]
    trainer.lightning_module.metric_name = "mse"
    trainer.callback_metrics = {"eval/forward_mse": torch.tensor(0.25)}
    assert run_summary(trainer, 0.0).splitlines()[2] == "Last task: forward mse 0.25."
    assert run_summary(trainer, 0.0, {"forward": (0.5, 3), "backward": (0.25, 1)}).splitlines()[2] == (
        "Last 3 tasks (mean): forward mse 0.5, backward mse 0.25 (tasks t − 1 … t − 5, 1 task)."
    )


SPHINX = re.compile(r":(?:class|func|meth|mod|attr|obj|data):|``")


def _help(args: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")  # what `| wc -l` sees
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_fit_help_is_short_plain_and_starts_with_the_package(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Model, data and the callback slots (each listing its monitor's own options) come before the Trainer's options;
    no Sphinx markup; at most 360 lines (it was 778 with each slot typed ``Callback``, 350 before data.probe_span)."""
    out = _help(["fit", "--help"], capsys, monkeypatch)
    assert len(out.splitlines()) <= 360
    assert not SPHINX.search(out), SPHINX.search(out)
    first = ("--model ", "--data.stream ", "--callbacks.hessian.every_n_tasks ", "--trainer.devices")
    order = [out.index(o) for o in first]
    assert order == sorted(order)
    for option in ("--callbacks.forgetting.plot_budget", "--callbacks.plasticity.probe_size", "--callbacks.cost "):
        assert option in out
    assert "GracefulStop" not in out  # internals are no choice for a slot
    assert "DataRecord" not in out


def test_learner_help_is_plain_text(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _help(["fit", "--model.help", "QueryOnlyAttention"], capsys, monkeypatch)
    assert "--model.support_size" in out
    assert not SPHINX.search(out), SPHINX.search(out)
