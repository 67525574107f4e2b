"""The budget study through the package: recall at several lags in one run, the bytes a learner holds, the
budget suites and the report's budget table (docs/results/lifelong_icl.md §1)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import CONFIGS, KNN, ROOT, fit

from cl_lightning.callbacks import CostMonitor
from cl_lightning.contract import EvalSlot, metric_key, parse_metric_key, split_metric_key
from cl_lightning.data import AssociativeRecall
from cl_lightning.data.datamodule import StreamDataModule
from cl_lightning.errors import UsageError
from cl_lightning.learners import ParametricAttention
from cl_lightning.memory.accounting import memory_bytes, stream_row_bytes
from cl_lightning.run.cli import main as cli_main
from cl_lightning.study.report import read_scalars
from cl_lightning.study.report_budget import budget_markdown, budget_study, crossover, write_budget
from cl_lightning.study.results import Experiment
from cl_lightning.study.suite import load_suite

SUITES = [CONFIGS / "suites" / f"lifelong_budget_{s}.yaml" for s in ("recall", "pmnist", "pmnist_data")]


def _module(lags: list[int], lag_tasks: int | None, tasks: int = 25) -> StreamDataModule:
    stream = AssociativeRecall(num_tasks=tasks, num_items=4, input_dim=8, train_size=16, query_size=8, chunk_size=8)
    return StreamDataModule(stream, context_size=0, lags=lags, lag_tasks=lag_tasks, num_probe_tasks=0)


def test_each_lag_is_its_own_slot_after_the_last_lag_tasks() -> None:
    dm = _module([20, 1, 5], lag_tasks=5)
    assert dm.eval_items(24) == [
        (4, [EvalSlot("lag", 20)]),
        (19, [EvalSlot("backward"), EvalSlot("lag", 5)]),  # one episode, both slots
        (23, [EvalSlot("lag", 1)]),
        (24, [EvalSlot("forward")]),
    ]
    assert dm.eval_items(19) == [(14, [EvalSlot("backward")]), (19, [EvalSlot("forward")])]  # before the last 5
    assert dm.eval_items(20)[0] == (0, [EvalSlot("lag", 20)])
    every = _module([1, 5], lag_tasks=None, tasks=4)
    assert every.eval_items(1) == [(0, [EvalSlot("lag", 1)]), (1, [EvalSlot("forward")])]  # no lag 5 yet


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"lags": [0, 1]}, "lags must be >= 1"), ({"lag_tasks": 0}, "lag_tasks")]
)
def test_bad_lags_are_refused(kwargs: dict, message: str) -> None:
    stream = AssociativeRecall(num_tasks=3, num_items=4, input_dim=8, train_size=16, query_size=8, chunk_size=8)
    with pytest.raises(ValueError, match=message):
        StreamDataModule(stream, **kwargs)


def test_lag_keys_round_trip_with_and_without_a_reading() -> None:
    for lag in (1, 5, 20):
        slot = EvalSlot("lag", lag)
        assert metric_key(slot, "acc") == f"eval/backward_acc/lag_{lag}"
        assert parse_metric_key(metric_key(slot, "mse"), "mse") == slot
        assert split_metric_key(metric_key(slot, "acc", "live"), "acc") == (slot, "live")
    assert parse_metric_key("eval/backward_acc", "acc") == EvalSlot("backward")


def test_a_fit_logs_live_recall_at_each_lag_and_the_bytes_held(tmp_path: Path) -> None:
    """kNN (k = 1) over a FIFO of 20 rows on 4 tasks of 16 examples: the logged lag-1 recall after the last task is
    the accuracy of its memory on task 2's queries, the bytes held 20 rows of (8 float32 + 2 int64) bytes."""
    knn = [*KNN[:1], "--model.memory_size=20", "--model.support_size=20", "--model.k=1", "--model.online_queries=0"]
    extra = ["--data.context_size=0", "--data.lags=[1, 2]", "--data.lag_tasks=2", "--data.num_probe_tasks=0"]
    extra += ["--trainer.callbacks+=cl_lightning.callbacks.CostMonitor"]
    cli = fit(tmp_path, knn, tasks=4, extra=extra)
    metrics, model, stream = cli.trainer.callback_metrics, cli.model, cli.datamodule.stream
    data = stream.task(2)
    with torch.no_grad():
        recall = (model(data.query_x).argmax(-1) == data.query_y).float().mean().item()
    assert metrics["eval/backward_acc/lag_1"].item() == pytest.approx(recall)
    assert "eval/backward_acc/lag_2" in metrics
    assert len(model.buffer) == 20
    assert metrics["memory/budget_bytes"].item() == 20 * (8 * 4 + 8 + 8) == memory_bytes(model).budget


def test_the_bytes_held_of_a_fast_state_and_of_rows_at_the_data_precision(tmp_path: Path) -> None:
    rule = ["--model=cl_lightning.learners.ParametricAttention", "--model.key_dim=6", "--model.hidden_sizes=[8]"]
    cost = ["--trainer.callbacks+=cl_lightning.callbacks.CostMonitor"]
    cli = fit(tmp_path, rule, tasks=1, extra=cost)
    assert isinstance(cli.model, ParametricAttention)
    assert cli.trainer.callback_metrics["memory/budget_bytes"].item() == 6 * 4 * 4  # d_k x C floats (4 classes)
    data = [*cost, "--trainer.callbacks.row_precision=data"]
    cli = fit(tmp_path / "data", [*KNN[:1], "--model.memory_size=8", "--model.support_size=8"], tasks=1, extra=data)
    assert cli.trainer.callback_metrics["memory/budget_bytes"].item() == 8 * (8 * 4 + 1)  # Gaussian x: float32


@pytest.mark.slow  # builds every cell's learner: ~10 s a suite
@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_the_budget_suites_size_each_learner_to_its_budget(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cell of the suite, built as its trial runs it: the learner's memory fits the budget as the study
    counts it (rows at least 2, the fast state's d_k from the budget)."""
    monkeypatch.chdir(ROOT)
    suite = load_suite(path)
    assert suite.budgets
    assert set(suite.budgets) == {t.name for t in suite.trials}
    assert sorted({t.seed for t in suite.trials}) == [0, 1, 2, 3, 4]
    for trial in [t for t in suite.trials if t.seed == 0]:
        cli = cli_main(trial.fit_args(ROOT / "logs" / "unused")[1:], run=False)
        cost = next(c for c in cli.trainer.callbacks if isinstance(c, CostMonitor))
        row = stream_row_bytes(cli.datamodule.stream, cost.row_precision)  # as the run logs memory/budget_bytes
        budget, held = suite.budgets[trial.name], memory_bytes(cli.model, row, held=False).budget
        assert held <= budget or cli.model.buffer.capacity == 2, trial.name
        assert held > budget / (2 if suite.budgets[trial.name] > 1024 else 4), trial.name


def test_a_budget_of_no_bytes_is_refused(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("{}")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0], "experiments": {"a": {"configs": ["c.yaml"], "budget": 0}}}))
    with pytest.raises(UsageError, match="budget"):
        load_suite(path)


def _experiment(name: str, label: str, lag1: list[list[float]], held: float) -> Experiment:
    exp = Experiment(name, label, 4, "acc", stream="AssociativeRecall")
    for seed, values in enumerate(lag1):
        curves = {
            "eval/backward_acc/lag_1": np.array([np.nan, np.nan, *values]),  # logged after the last 2 tasks
            "eval/forward_acc": np.array([0.5, 0.5, 0.5, 0.25 * (seed + 1)]),
            "memory/budget_bytes": np.full(4, held),
        }
        exp.add(seed, curves, {})
    return exp


def test_the_budget_table_and_the_crossover_from_logged_values(tmp_path: Path) -> None:
    """Per seed the mean over the logged tasks, then mean ± population std over seeds; kNN (a buffer: memory_size
    in its config) reaches the rule from 4 KB on."""
    for name, init in (
        ("knn_1k", {"memory_size": 2}),
        ("knn_4k", {"memory_size": 7}),
        ("rule_1k", {}),
        ("rule_4k", {}),
    ):
        (tmp_path / name / "seed_0").mkdir(parents=True)
        (tmp_path / name / "seed_0" / "config.yaml").write_text(yaml.safe_dump({"model": {"init_args": init}}))
    experiments = [
        _experiment("knn_1k", "knn", [[0.1, 0.3], [0.2, 0.2]], 1056),
        _experiment("knn_4k", "knn", [[1.0, 1.0], [0.5, 1.0]], 3696),
        _experiment("rule_1k", "delta", [[0.6, 0.6], [0.6, 0.6]], 1000),
        _experiment("rule_4k", "delta", [[0.8, 0.8], [0.8, 0.8]], 4080),
    ]
    meta = {"budgets": {"knn_1k": 1024, "knn_4k": 4096, "rule_1k": 1024, "rule_4k": 4096}}
    study = budget_study(tmp_path, experiments, meta)
    knn = study["cells"]["knn"]
    assert (knn[1024]["mean1"], knn[1024]["std1"]) == pytest.approx((0.2, 0.0))
    assert (knn[4096]["mean1"], knn[4096]["std1"]) == pytest.approx((0.875, 0.125))
    assert knn[4096]["forward"] == pytest.approx(0.375)
    assert knn[4096]["bytes"] == 3696
    assert study["buffers"] == ["knn"]
    assert study["crossover"] == {1: 4096}
    text = budget_markdown(study)
    assert "| AssociativeRecall | knn | 4,096 | 3,696 | 0.375 ± 0.125 | 0.875 ± 0.125 |" in text
    assert text.rstrip().endswith("lag 1: 4,096 B")
    assert not math.isnan(study["cells"]["delta"][1024]["mean1"])
    out = tmp_path / "report"
    out.mkdir()
    assert write_budget(tmp_path, experiments, meta, out).endswith(text)
    assert json.loads((out / "budget.json").read_text())["crossover"] == {"1": 4096}
    assert (out / "budget.png").stat().st_size > 0
    assert write_budget(tmp_path, experiments, {}, out) == ""  # not a budget study: no section


@pytest.mark.slow
def test_a_suite_cell_regenerates_the_benchmark_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """knn_fifo_1024 and delta_rule_1024 on AssociativeRecall, seed 0, through the suite's own arguments: the values
    the former benchmarks/lifelong_budget.py gave for that seed (docs/results/lifelong_icl.md, "Regenerated")."""
    monkeypatch.chdir(ROOT)
    suite = load_suite(SUITES[0])
    expected = {
        "knn_fifo_1024": (0.203125, 0.1203125, 0.1140625, 0.028125),
        "delta_rule_1024": (1.0, 0.665625, 0.2515625, 0.0859375),
    }
    for trial in [t for t in suite.trials if t.seed == 0 and t.name in expected]:
        cli = cli_main([*trial.fit_args(tmp_path)[1:], "--callbacks.checkpoint=null"], run=False)
        cli.trainer.fit(cli.model, cli.datamodule)
        scalars = read_scalars(trial.log_dir(tmp_path))
        lags = [np.mean(list(scalars[f"eval/backward_acc/lag_{lag}"].values())) for lag in (1, 5, 20)]
        forward = scalars["eval/forward_acc"][max(scalars["eval/forward_acc"])]
        assert [forward, *lags] == pytest.approx(expected[trial.name], abs=1e-7), trial.name


def test_the_crossover_needs_the_buffers_ahead_at_every_larger_budget() -> None:
    """The former benchmark's case: ties count for the buffer, and lag 1 stays with the rule."""
    means = {"knn_reservoir": {1024: (0.1, 0.1, 0.1), 4096: (0.9, 0.7, 0.5)}, "delta_rule": {1024: (0.8, 0.3, 0.1),
             4096: (0.95, 0.6, 0.1)}}  # fmt: skip
    cells = {
        n: {b: dict(zip(("mean1", "mean5", "mean20"), m, strict=True)) for b, m in c.items()} for n, c in means.items()
    }
    assert {lag: crossover(cells, {"knn_reservoir"}, lag) for lag in (1, 5, 20)} == {1: None, 5: 4096, 20: 1024}
