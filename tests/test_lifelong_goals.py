"""The goals study through the package: StableKeyMemory's settings against the two goals at <= 40 KB as suites
that `sweep` runs and `report` reads, in the budget study's table (docs/results/lifelong_icl.md §3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import CONFIGS, ROOT

from cl_lightning.learners import StableKeyMemory
from cl_lightning.memory.accounting import memory_bytes
from cl_lightning.run.cli import main as cli_main
from cl_lightning.study.report import read_scalars
from cl_lightning.study.report_budget import budget_markdown, budget_study
from cl_lightning.study.results import Experiment
from cl_lightning.study.suite import load_suite

SUITES = {s: CONFIGS / "suites" / f"lifelong_goals_{s}.yaml" for s in ("recall", "pmnist")}
# the committed tables' settings (docs/results/lifelong_icl/goals_*.md) and their bytes, R counted (§3's table)
SETTINGS = {
    "recall": {(1, 1000): 552_520, (8, 112): 97_288, (1, 73): 40_816, (1, 256): 141_832, (1, 512): 283_144},
    "pmnist": {(1, 1000): 236_204, (8, 112): 59_368, (8, 76): 40_792},
}


@pytest.mark.parametrize("stream", list(SUITES))
def test_the_goals_suites_run_the_committed_settings_at_their_bytes(
    stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each experiment is one (routes, d_k) of the committed tables, all at the goal's one budget, 5 seeds; the
    learner each builds holds the bytes §3 gives (states + routing state + R)."""
    monkeypatch.chdir(ROOT)
    suite = load_suite(SUITES[stream])
    assert set(suite.budgets.values()) == {40 * 1024}
    assert sorted({t.seed for t in suite.trials}) == [0, 1, 2, 3, 4]
    held = {}
    for trial in [t for t in suite.trials if t.seed == 0]:
        model = cli_main(trial.fit_args(ROOT / "logs" / "unused")[1:], run=False).model
        assert isinstance(model, StableKeyMemory)
        held[(model.routes, model.key_dim)] = memory_bytes(model).budget
        assert suite.labels[trial.name].endswith(f"(d_k {model.key_dim:,})")
    assert held == SETTINGS[stream]


def test_a_suite_of_rules_only_has_no_crossover(tmp_path: Path) -> None:
    """The goals' table: one budget, no buffer learner, so the table has no crossover line."""
    exp = Experiment("r1_dk73", "sign keys, 1 state (d_k 73)", 3, "acc", stream="AssociativeRecall")
    nan = np.nan
    exp.add(0, {"eval/backward_acc/lag_1": np.array([nan, 0.5, 1.0]), "eval/forward_acc": np.ones(3),
                "memory/budget_bytes": np.full(3, 40_816.0)}, {})  # fmt: skip
    study = budget_study(tmp_path, [exp], {"budgets": {"r1_dk73": 40_960}})
    assert study["crossover"] == {}
    text = budget_markdown(study)
    # one seed: the value alone, never a "± 0.000" that reads as seeds agreeing
    assert "| AssociativeRecall | sign keys, 1 state (d_k 73) | 40,960 | 40,816 | 1.000 | 0.750 |" in text
    assert "Crossover" not in text
    over = budget_markdown(budget_study(tmp_path, [exp], {"budgets": {"r1_dk73": 40_000}}))
    assert "| 40,000 | 40,816 (over) |" in over  # holding more than its budget is marked


@pytest.mark.slow  # one AssociativeRecall fit: ~30 s
def test_a_goals_cell_regenerates_the_benchmark_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 state of d_k 73 on AssociativeRecall, seed 0, through the suite's own arguments: the per-seed values the
    former benchmarks/lifelong_goals.py committed (goals_AssociativeRecall_1x73.json, run 0)."""
    monkeypatch.chdir(ROOT)
    trial = next(t for t in load_suite(SUITES["recall"]).trials if t.name == "r1_dk73" and t.seed == 0)
    cli = cli_main([*trial.fit_args(tmp_path)[1:], "--callbacks.checkpoint=null"], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    scalars = read_scalars(trial.log_dir(tmp_path))
    lags = [np.mean(list(scalars[f"eval/backward_acc/lag_{lag}"].values())) for lag in (1, 5, 20)]
    forward = scalars["eval/forward_acc"][max(scalars["eval/forward_acc"])]
    assert [forward, *lags] == pytest.approx([1.0, 0.9671875, 0.3890625, 0.0875], abs=1e-7)
    assert scalars["memory/budget_bytes"][max(scalars["memory/budget_bytes"])] == 40_816
