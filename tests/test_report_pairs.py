"""The learned-against-fixed pairs of a report (``report_pairs.py``), on hand-made suites with known answers."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_report import _write

from cl_lightning.study.report import load_suite_runs, main, table_rows
from cl_lightning.study.report_pairs import pair_row, pair_rows
from cl_lightning.study.results import Experiment

TASKS = 160  # plot windows of 160 // 80 = 2 tasks


def _run(suite: Path, name: str, seed: int, values: dict[str, dict[int, float]], support: int | None) -> None:
    d = suite / name / f"seed_{seed}"
    d.mkdir(parents=True)
    model = {"init_args": {"support_size": support}} if support else {"init_args": {}}
    data = {"stream": {"class_path": "x.PermutedMNIST", "init_args": {"num_tasks": TASKS}}, "context_size": 200}
    (d / "config.yaml").write_text(yaml.safe_dump({"model": model, "data": data}))
    _write(d, values)


def _suite(tmp_path: Path) -> Path:
    """A learner rising through a constant kernel: 0.5 + t / 1000 (+ 0.01 (seed - 1)) against 0.6, so its
    three-seed window w (tasks 2w, 2w + 1) is above the kernel from w = 50; its seed 2 stops after task 119."""
    suite = tmp_path / "toy"
    suite.mkdir()
    meta = {"name": "toy", "experiments": ["qoa", "knn"], "labels": {"qoa": "QOA", "knn": "kNN"}}
    (suite / "suite.yaml").write_text(yaml.safe_dump({**meta, "kernels": {"qoa": "knn"}}))
    for seed in (0, 1, 2):
        last = 119 if seed == 2 else TASKS - 1
        learner = {t: 0.5 + t / 1000 + 0.01 * (seed - 1) for t in range(last + 1)}
        _run(suite, "qoa", seed, {"eval/forward_acc": learner}, support=1000)
        chosen = {"knn/k": {0: 1.0 if seed == 2 else 5.0}, "knn/gaussian": {0: 0.0}, "knn/standardised": {0: seed == 2}}
        _run(suite, "knn", seed, {"eval/forward_acc": dict.fromkeys(range(TASKS), 0.6), **chosen}, support=200)
    return suite


def test_a_pair_counts_the_windows_every_paired_seed_completed(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    experiments, meta = load_suite_runs(suite)
    (row,) = pair_rows(experiments, meta, suite)
    assert (row["suite"], row["learner"], row["stream"], row["support"]) == ("toy", "QOA", "PermutedMNIST", 200)
    assert row["kernel"] == "kNN (seed 0: k=5 1/d; seed 1: k=5 1/d; seed 2: k=1 1/d standardised)"
    assert row["seeds"] == "0 1 2"
    # all 80 windows count; 0..59 over three seeds (the offsets cancel: better from window 50 on), 60..79 over seeds 0
    # and 1 (seed 2 stopped after task 119; their mean offset -0.005: better from window 53, so all 20)
    assert (row["windows"], row["windows_learner_better"], row["window_tasks"]) == (80, 30, 2)
    # table.csv's final window (max(2, 5) = 5 tasks: 155..159) of the finished seeds 0 and 1: 0.647 and 0.657
    assert row["final_seeds"] == 2
    assert row["learner_final"] == pytest.approx(0.652)
    assert row["learner_final_std"] == pytest.approx(0.005)
    assert row["kernel_final"] == pytest.approx(0.6)
    assert row["kernel_final_std"] == pytest.approx(0.0)
    table = {r["experiment"]: r for r in table_rows(experiments, meta)}
    assert row["learner_final"] == table["qoa"]["forward_mean"]  # the pair's final is table.csv's
    assert row["learner_final_std"] == table["qoa"]["forward_std"]


def test_for_a_regression_score_lower_is_better() -> None:
    def exp(name: str, values: np.ndarray) -> Experiment:
        e = Experiment(name, name, values.shape[1], "mse")
        for seed, row in enumerate(values):
            e.add(seed, {"eval/forward_mse": row}, {})
        return e

    learner = exp("qoa", np.array([[0.03] * 80 + [0.09] * 80]))  # below the kernel's 0.07 in windows 0..39
    row = pair_row(learner, exp("knn", np.full((1, 160), 0.07)), Path("missing"), "s")
    assert (row["windows"], row["windows_learner_better"], row["support"]) == (80, 40, "")
    assert row["learner_final"] == pytest.approx(0.09)
    assert np.isnan(row["learner_final_std"])  # one seed: no spread


def test_the_report_writes_pairs_and_gathers_suites_in_one_file(tmp_path: Path) -> None:
    gathered = tmp_path / "learned_vs_fixed" / "pairs.csv"
    gathered.parent.mkdir()
    with gathered.open("w", newline="") as f:  # an earlier report: another suite's row stays, toy's is replaced
        f.write("suite,learner\nother,Backprop\ntoy,stale\n")
    out = tmp_path / "out"
    assert main([str(_suite(tmp_path)), "--out", str(out), "--pairs", str(gathered), "--block", "0"]) == 0
    with (out / "pairs.csv").open() as f:
        (mine,) = list(csv.DictReader(f))
    assert (mine["learner"], mine["windows_learner_better"]) == ("QOA", "30")
    with gathered.open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["suite"], r["learner"]) for r in rows] == [("other", "Backprop"), ("toy", "QOA")]
    table = (out / "table.md").read_text()
    assert "## Learned against fixed, at equal support" in table
    assert "| QOA | PermutedMNIST | 200 |" in table
    assert "30 of 80 windows of 2 | 0.652 ± 0.005 | 0.600 ± 0.000 |" in table
