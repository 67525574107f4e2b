"""The encoder study through the package: the keys' coherence (metric, monitor, report column) and its suite
(docs/results/lifelong_scorecard.md, the encoder study)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CONFIGS, ROOT

from cl_lightning.metrics.key_coherence import cross_task_coherence
from cl_lightning.run.cli import main as cli_main
from cl_lightning.study.report import read_scalars
from cl_lightning.study.report_budget import budget_markdown, budget_study
from cl_lightning.study.results import Experiment
from cl_lightning.study.suite import load_suite

BUDGET = CONFIGS / "lifelong" / "budget"
SUITE = CONFIGS / "suites" / "lifelong_encoder_pmnist.yaml"


def test_coherence_is_zero_for_orthogonal_tasks_and_one_for_a_shared_direction() -> None:
    eye = torch.eye(3)
    assert cross_task_coherence(eye, torch.tensor([0, 1, 2])).item() == 0.0
    same = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0]])  # |cos| ignores the sign
    assert cross_task_coherence(same, torch.tensor([0, 1, 1])).item() == 1.0
    # pairs within a task do not count: tasks {0, 1} and {2}: |cos| of (0, 2) and (1, 2)
    keys = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert cross_task_coherence(keys, torch.tensor([0, 0, 1])).item() == 0.0


def _fit(tmp_path: Path, *extra: str) -> object:
    args = ["--config", str(BUDGET / "recall.yaml"), "--config", str(BUDGET / "rule.yaml")]
    args += [
        "--data.stream.init_args.num_tasks=4",
        "--data.stream.init_args.train_size=64",
        "--callbacks.checkpoint=null",
    ]
    args += ["--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", *extra]
    args += [f"--trainer.logger.init_args.save_dir={tmp_path}"]
    cli = cli_main(args, run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    return cli


def test_the_monitor_logs_the_coherence_of_the_last_window_of_tasks(tmp_path: Path) -> None:
    """The delta rule on 4 AssociativeRecall tasks, window 3: after the last task, the |cos| between the first 5
    queries' read keys (first head) of tasks 1-3, as the learner is at the end; none after task 0."""
    monitor = '--trainer.callbacks=[{"class_path": "cl_lightning.callbacks.KeyCoherenceMonitor", '
    monitor += '"init_args": {"window": 3, "queries_per_task": 5}}]'
    cli = _fit(tmp_path, monitor)
    model, dm = cli.model, cli.datamodule
    with torch.no_grad():
        keys = [model.read_keys(dm.stream.task(t).query_x[:5])[0] for t in (1, 2, 3)]
    expected = cross_task_coherence(torch.cat(keys), torch.arange(3).repeat_interleave(5))
    assert cli.trainer.callback_metrics["fast_weights/key_coherence"].item() == pytest.approx(expected.item())
    logged = read_scalars(Path(cli.trainer.logger.log_dir))["fast_weights/key_coherence"]
    assert len(logged) == 3  # after tasks 1, 2 and 3


def test_the_monitor_needs_a_learner_that_reads_with_keys(tmp_path: Path) -> None:
    args = ["--config", str(BUDGET / "recall.yaml"), "--config", str(BUDGET / "knn.yaml")]
    args += ["--trainer.callbacks=[{class_path: cl_lightning.callbacks.KeyCoherenceMonitor}]"]
    args += ["--callbacks.checkpoint=null", "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]
    args += ["--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"]
    cli = cli_main(args, run=False)
    with pytest.raises(TypeError, match="KeyCoherenceMonitor needs the KeyedLearner interface; KNN lacks read_keys"):
        cli.trainer.fit(cli.model, cli.datamodule)


def test_the_budget_table_has_a_key_coherence_column_when_logged(tmp_path: Path) -> None:
    """Each seed's value after its last task, mean ± population std over seeds, after the lags."""
    exp = Experiment("online", "encoder online, d_k 128", 3, "acc", stream="PermutedMNIST")
    nan = np.nan
    for seed, cos in enumerate([0.25, 0.75]):
        exp.add(seed, {"eval/forward_acc": np.ones(3), "memory/budget_bytes": np.full(3, 5120.0),
                       "eval/backward_acc/lag_1": np.array([nan, 0.5, 0.5]),
                       "fast_weights/key_coherence": np.array([nan, 0.0, cos])}, {})  # fmt: skip
    text = budget_markdown(budget_study(tmp_path, [exp], {"budgets": {"online": 5120}}))
    assert "| forward | lag 1 | key \\|cos\\| |" in text
    assert "| 5,120 | 5,120 | 1.000 ± 0.000 | 0.500 ± 0.000 | 0.500 ± 0.250 |" in text


@pytest.mark.slow
def test_the_encoder_suite_regenerates_the_benchmark_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder trained online, d_k 128, seed 0 (one 25-task fit, ~1 min): the values the former benchmark part
    wrote (benchmarks/lifelong_icl.py before the move): forward, live recall at lags 1, 5, 20, key |cos|."""
    monkeypatch.chdir(ROOT)
    trial = next(t for t in load_suite(SUITE).trials if t.name == "online")
    cli = cli_main([*trial.fit_args(tmp_path)[1:], "--callbacks.checkpoint=null"], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    scalars = read_scalars(trial.log_dir(tmp_path))
    last = {tag: list(scalars[tag].values())[-1] for tag in ("eval/forward_acc", "fast_weights/key_coherence")}
    lags = [np.mean(list(scalars[f"eval/backward_acc/lag_{lag}"].values())) for lag in (1, 5, 20)]
    got = [last["eval/forward_acc"], *lags, last["fast_weights/key_coherence"]]
    assert got == pytest.approx([0.79000002, 0.32799999, 0.10300000, 0.12000000, 0.34878853], abs=1e-6)
