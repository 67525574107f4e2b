"""The P1 probe through the package: the data module's written / unseen slots, the rule suites and the report's
columns (docs/results/lifelong_icl.md §4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CONFIGS, ROOT

from cl_lightning.contract import EvalSlot, metric_key, parse_metric_key, split_metric_key
from cl_lightning.data import AssociativeRecall, SyntheticClasses
from cl_lightning.data.datamodule import EpisodeDataset, StreamDataModule
from cl_lightning.memory.accounting import memory_bytes
from cl_lightning.run.cli import main as cli_main
from cl_lightning.study.report import read_scalars
from cl_lightning.study.report_budget import budget_markdown, budget_study
from cl_lightning.study.results import Experiment
from cl_lightning.study.suite import load_suite

RECALL = CONFIGS / "lifelong" / "rule" / "recall.yaml"
SUITES = {n: CONFIGS / "suites" / f"lifelong_rule_n{n}.yaml" for n in (8, 32, 128)}
# the committed table's learners (docs/results/lifelong_icl/rule.md) and the context bytes each holds; StableKeyMemory's
# fixed projection R (16 x 128 float32: 8,192 B) is counted since the goals study (the committed table has 5,192)
HELD = {
    "delta rule (d_k 128)": 5_120,
    "delta rule, encoder frozen at init (d_k 128)": 5_120,
    "gated delta rule (d_k 128)": 5_120,
    "linear attention, Hebbian (d_k 128)": 5_120,
    "TTT-Linear (d_k 36)": 5_328,
    "StableKeyMemory (1 state, d_k 128)": 13_384,
    "kNN, k = 1 (FIFO, 64 rows)": 5_120,
    "QOA (FIFO, 64 rows)": 5_120,
}


def _rule_stream(tasks: int = 4) -> AssociativeRecall:
    return AssociativeRecall(tasks, 8, 10, 16, 64, 32, 32, rule=True, seed=0)


def test_the_probe_scores_written_and_unseen_keys_after_each_task_from_its_first() -> None:
    """From ``recall_probe_from`` on, the task's queries are also logged as unseen, and its written keys (the
    stream's clean items with their rule values) are one more episode; before it, neither."""
    stream = _rule_stream()
    module = StreamDataModule(stream, context_size=0, backward_lag=1, num_probe_tasks=0, recall_probe_from=2)
    assert [s.role for _, slots in module.eval_items(1) for s in slots] == ["backward", "forward"]
    items = module.eval_items(2)
    assert items == [(1, [EvalSlot("backward")]), (2, [EvalSlot("forward"), EvalSlot("unseen")]),
                     (2, [EvalSlot("written")])]  # fmt: skip
    episodes = list(EpisodeDataset(stream, items, 0, None))
    keys, values = stream.items(2)
    assert torch.equal(episodes[2].episode.query_x, keys)
    assert torch.equal(episodes[2].episode.query_y, values)
    assert torch.equal(values, stream.rule_values(2, keys))
    assert torch.equal(episodes[1].episode.query_x, stream.unseen_keys(2))
    assert episodes[2].episode.context_x.shape[0] == 0


def test_the_probe_needs_a_stream_that_writes_keys_and_a_task() -> None:
    with pytest.raises(ValueError, match="writes no keys"):
        SyntheticClasses(num_tasks=2).written_episode(0, 0)
    with pytest.raises(ValueError, match="recall_probe_from"):
        StreamDataModule(_rule_stream(), recall_probe_from=-1)


def test_probe_keys_round_trip_with_and_without_a_reading() -> None:
    for role in ("written", "unseen"):
        slot = EvalSlot(role)
        assert metric_key(slot, "acc") == f"eval/{role}_acc"
        assert parse_metric_key(metric_key(slot, "mse"), "mse") == slot
        assert split_metric_key(metric_key(slot, "acc", "live"), "acc") == (slot, "live")


def test_a_fit_logs_the_recall_of_written_and_unseen_keys(tmp_path: Path) -> None:
    """kNN (k = 1, FIFO of 20 rows) on 4 rule tasks: the last task's logged scores are its memory's accuracy on the
    task's written keys and on its unseen keys (the forward score, under its own name)."""
    args = ["--config", str(RECALL), "--config", str(CONFIGS / "lifelong" / "budget" / "knn.yaml")]
    args += ["--data.stream.init_args.num_tasks=4", "--data.stream.init_args.train_size=64"]
    args += ["--model.init_args.memory_size=20", "--model.init_args.support_size=20", "--callbacks.checkpoint=null"]
    args += ["--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"]
    args += [f"--trainer.logger.init_args.save_dir={tmp_path}"]
    cli = cli_main(args, run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    metrics, model, stream = cli.trainer.callback_metrics, cli.model, cli.datamodule.stream
    (keys, values), data = stream.items(3), stream.task(3)
    with torch.no_grad():
        written = (model(keys).argmax(-1) == values).float().mean().item()
        unseen = (model(data.query_x).argmax(-1) == data.query_y).float().mean().item()
    assert metrics["eval/written_acc"].item() == pytest.approx(written)
    assert metrics["eval/unseen_acc"].item() == pytest.approx(unseen) == metrics["eval/forward_acc"].item()
    # the references (RuleReferenceMonitor): the task's own examples and written keys, read on its unseen keys
    onehot = torch.nn.functional.one_hot(data.train_y, 10).float()
    lstsq = torch.linalg.lstsq(data.train_x, onehot).solution
    least_squares = ((data.query_x @ lstsq).argmax(-1) == data.query_y).float().mean().item()
    nearest = (values[torch.cdist(data.query_x, keys).argmin(-1)] == data.query_y).float().mean().item()
    assert metrics["reference/least_squares_acc"].item() == pytest.approx(least_squares)
    assert metrics["reference/nearest_pair_acc"].item() == pytest.approx(nearest)


def test_the_reference_monitor_needs_written_keys(tmp_path: Path) -> None:
    args = ["--config", str(RECALL), "--data.stream=cl_lightning.data.SyntheticClasses"]
    args += ["--data.recall_probe_from=null", "--model=cl_lightning.learners.KNN", "--callbacks.checkpoint=null"]
    args += ["--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]
    args += ["--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"]
    cli = cli_main(args, run=False)
    with pytest.raises(ValueError, match="writes no keys"):
        cli.trainer.fit(cli.model, cli.datamodule)


def test_the_rule_suites_run_the_committed_learners_at_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each suite is one n: the committed table's 8 learners at about 5,120 B, 5 seeds; each learner built as its
    trial builds it holds the committed bytes (a FIFO buffer's when full: 64 rows of 80 B)."""
    monkeypatch.chdir(ROOT)
    for n, path in SUITES.items():
        suite = load_suite(path)
        assert set(suite.budgets.values()) == {5120}
        assert sorted({t.seed for t in suite.trials}) == [0, 1, 2, 3, 4]
        assert sorted(suite.labels.values()) == sorted(HELD)
        assert f"--data.stream.init_args.num_items={n}" in suite.trials[0].args
    suite, held = load_suite(SUITES[8]), {}
    for trial in [t for t in suite.trials if t.seed == 0]:
        model = cli_main(trial.fit_args(ROOT / "logs" / "unused")[1:], run=False).model
        buffer = getattr(model, "buffer", None)
        held[suite.labels[trial.name]] = buffer.capacity * 80 if buffer is not None else memory_bytes(model).budget
    assert held == HELD


def test_the_budget_table_has_a_column_per_probe(tmp_path: Path) -> None:
    """Written and unseen keys: per seed the mean over the tasks logged, mean ± population std over seeds."""
    exp = Experiment("delta_rule", "delta rule (d_k 128)", 4, "acc", stream="AssociativeRecall")
    nan = np.nan
    for seed, (w, u) in enumerate([(1.0, 0.25), (0.5, 0.75)]):
        exp.add(seed, {"eval/written_acc": np.array([nan, nan, w, w]), "eval/unseen_acc": np.array([nan, nan, u, u]),
                       "eval/forward_acc": np.ones(4), "memory/budget_bytes": np.full(4, 5120.0),
                       "reference/least_squares_acc": np.full(4, 0.5), "reference/nearest_pair_acc": np.full(4, 0.25),
                       }, {})  # fmt: skip
    study = budget_study(tmp_path, [exp], {"budgets": {"delta_rule": 5120}})
    assert study["probes"] == ["written", "unseen"]
    text = budget_markdown(study)
    assert "| forward | written keys | unseen keys (rule) |" in text
    assert "| delta rule (d_k 128) | 5,120 | 5,120 | 1.000 ± 0.000 | 0.750 ± 0.250 | 0.500 ± 0.250 |" in text
    assert "| least squares on the task's examples | - | - | - | - | 0.500 ± 0.000 |" in text
    assert text.index("nearest written pair (1-NN, unbounded) | - | - | - | - | 0.250 ± 0.000 |") < text.index("delta")


def test_a_rule_cell_regenerates_the_benchmark_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The delta rule at n = 8, seed 0, through the suite's own arguments (one 10-task fit, ~3 s): the former
    benchmark's seed-0 values (benchmarks/lifelong_rule.run: written and unseen keys, mean over tasks 2-9)."""
    monkeypatch.chdir(ROOT)
    trial = next(t for t in load_suite(SUITES[8]).trials if t.name == "delta_rule" and t.seed == 0)
    cli = cli_main([*trial.fit_args(tmp_path)[1:], "--callbacks.checkpoint=null"], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    scalars = read_scalars(trial.log_dir(tmp_path))
    scores = [np.mean(list(scalars[f"eval/{role}_acc"].values())) for role in ("written", "unseen")]
    assert len(scalars["eval/written_acc"]) == 8
    assert scores == pytest.approx([1.0, 0.1884765625], abs=1e-7)
