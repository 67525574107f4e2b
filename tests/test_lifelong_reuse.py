"""The reuse study through the package: recurring maps on AssociativeRecall and Permuted MNIST as suites that `sweep`
runs and `report` reads (docs/results/lifelong_icl.md §2), the data module's `returns` slots and the reuse table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CONFIGS, ROOT

from cl_lightning.contract import EvalSlot
from cl_lightning.data import AssociativeRecall
from cl_lightning.data.datamodule import EpisodeDataset, StreamDataModule
from cl_lightning.memory.accounting import memory_bytes
from cl_lightning.run.cli import main as cli_main
from cl_lightning.study.report import read_scalars
from cl_lightning.study.report_reuse import reuse_cell, reuse_markdown, reuse_study
from cl_lightning.study.results import Experiment
from cl_lightning.study.suite import load_suite

SUITES = {s: CONFIGS / "suites" / f"lifelong_reuse_{s}.yaml" for s in ("recall", "pmnist", "revise")}
# the state bytes by label: the levers' as the committed tables (docs/results/lifelong_icl/reuse*.md); StableKeyMemory's
# with its fixed projection R counted (memory.accounting, as §3's goals table), which those tables, older, left out:
# they give 5,640 (recall), 40,204, 37,416, 5,324 and 5,416 (Permuted MNIST), R's d_in x d_k floats less
LEVERS = {
    "delta rule (d_k 128)": 5_120,
    "Q1 forget gate (gated delta rule)": 5_120,
    "Q1 weight decay (titans, mu0 0.01, d_k 64)": 5_120,
    "Q1 4 heads x d_k 32": 5_120,
    "linear attention (Hebbian)": 5_120,
    "Q1 forget gate on linear attention (decay)": 5_120,
}
BYTES = {
    "recall": {**LEVERS, "sign keys, 1 state (d_k 128)": 71_176},
    "revise": {
        f"{label}, f {f}": held
        for f in ("0.25", "1.0")
        for label, held in {**LEVERS, "sign keys, 1 state (d_k 128)": 71_176}.items()
    },
    "pmnist": {
        **LEVERS,
        "sign keys, 1 state (d_k 1,000)": 236_204,
        "sign keys, 8 routed states (d_k 112)": 59_368,
        "sign keys, 1 state (d_k 128)": 30_412,
        "sign keys, 8 routed states (d_k 12)": 7_768,
    },
}


def _stream(recur_every: int | None = 3) -> AssociativeRecall:
    return AssociativeRecall(num_tasks=7, num_items=4, input_dim=8, train_size=16, query_size=8, chunk_size=8,
                             recur_every=recur_every)  # fmt: skip


def test_returns_scores_the_next_task_by_the_times_its_map_was_shown() -> None:
    """After task t, task t + 1's episode under visit (t + 1) // k: 0 for maps not yet shown, then each return; none
    after the last task."""
    dm = StreamDataModule(_stream(), context_size=0, num_probe_tasks=0, returns=True)
    found = {
        (epoch, task): slot.task
        for epoch in range(7)
        for task, slots in dm.eval_items(epoch)
        for slot in slots
        if slot.role == "return"
    }
    assert found == {(0, 1): 0, (1, 2): 0, (2, 3): 1, (3, 4): 1, (4, 5): 1, (5, 6): 2}
    assert all(s.role != "return" for _, slots in StreamDataModule(_stream()).eval_items(2) for s in slots)


def test_returns_needs_a_recurring_stream() -> None:
    with pytest.raises(ValueError, match="recur_every"):
        StreamDataModule(_stream(None), returns=True)


def _revising() -> AssociativeRecall:
    return AssociativeRecall(num_tasks=7, num_items=4, input_dim=8, train_size=16, query_size=32, chunk_size=8,
                             revise=True, change_fraction=0.5)  # fmt: skip


def test_a_revision_episode_holds_the_revised_keys_queries_with_new_or_old_answers() -> None:
    stream = _revising()
    for task in range(1, 7):
        slots = stream.slots(task)[stream.train_size :]
        revised = (stream.born(task) == task)[slots]
        new, old = (stream.revision_episode(task, 0, None, answer) for answer in ("new", "old"))
        assert torch.equal(new.query_x, stream.task(task).query_x[revised])
        assert torch.equal(new.query_y, stream.items(task)[1][slots][revised])
        assert torch.equal(old.query_y, stream.items(task - 1)[1][slots][revised])
        assert not (new.query_y == old.query_y).any()  # a revised key's value changes
    with pytest.raises(ValueError, match="revise"):
        _stream().revision_episode(1, 0)


def test_revisions_score_each_task_but_the_first_on_episodes_of_their_own() -> None:
    dm = StreamDataModule(_revising(), context_size=0, num_probe_tasks=0, revisions=True)
    assert all(s.role not in ("revised", "stale") for _, slots in dm.eval_items(0) for s in slots)
    items = dm.eval_items(3)
    assert set(items[-1][1]) == {EvalSlot("forward"), EvalSlot("revised"), EvalSlot("stale")}
    batches = list(EpisodeDataset(dm.stream, items, 0, None))
    assert len(batches) == len(EpisodeDataset(dm.stream, items, 0, None))
    by_slot = {b.slots: b for b in batches if b.task == 3}
    assert set(by_slot) == {(EvalSlot("forward"),), (EvalSlot("revised"),), (EvalSlot("stale"),)}
    assert by_slot[(EvalSlot("revised"),)].episode.query_x.shape[0] < 32
    with pytest.raises(ValueError, match="revise"):
        StreamDataModule(_stream(), revisions=True)


def test_the_reuse_table_reads_revised_and_stale_from_task_5_on() -> None:
    exp = Experiment("decay_f1", "Q1 forget gate on linear attention (decay), f 1.0", 7, "acc")
    nan = np.nan
    exp.add(0, {"eval/forward_acc": np.full(7, 0.5), "eval/revised_acc": np.array([nan, 0, 0, 0, 0, 0.5, 1]),
                "eval/stale_acc": np.array([nan, 1, 1, 1, 1, 0.25, 0.0])}, {})  # fmt: skip
    c = reuse_cell(exp)
    assert (c["forward"], c["revised"], c["stale"]) == (0.5, 0.75, 0.125)
    assert np.isnan(c["first_visit"])
    assert "| 0.500 | 0.750 | 0.125 | - | - | - | - |" in reuse_markdown(reuse_study([exp]))  # one seed: no spread


def test_the_reuse_table_reads_forward_first_visit_and_returns() -> None:
    """k = 3 over 7 tasks: before first visit from visit 0, first visit from forward at tasks 0 .. k-1, the first and
    the last return from visits 1 and 2, forward from task 5 on; mean ± population std over seeds."""
    exp = Experiment("delta_rule", "delta rule (d_k 128)", 7, "acc", stream="AssociativeRecall")
    nan = np.nan
    for seed, shift in ((0, 0.0), (1, 0.5)):
        exp.add(seed, {
            "eval/forward_acc": np.array([1.0, 0.5, 0.0, 1.0, 1.0, 0.5, 0.5]) - shift / 2,
            "eval/return_acc/visit_0": np.array([0.1, 0.3, nan, nan, nan, nan, nan]),
            "eval/return_acc/visit_1": np.array([nan, nan, 0.5, 0.25, shift, nan, nan]),
            "eval/return_acc/visit_2": np.array([nan, nan, nan, nan, nan, 0.75, nan]),
            "memory/budget_bytes": np.full(7, 5_120.0),
        }, {})  # fmt: skip
    c = reuse_cell(exp)
    assert (c["bytes"], c["forward"], c["forward_std"]) == (5_120, 0.375, 0.125)
    assert (c["before_first"], c["before_first_std"]) == (0.2, 0.0)
    assert (c["first_visit"], c["first_visit_std"]) == (0.375, 0.125)
    assert c["return_first"] == pytest.approx(0.3333333)
    assert c["return_last"] == 0.75
    text = reuse_markdown(reuse_study([exp]))
    row = "| AssociativeRecall | delta rule (d_k 128) | 5,120 | 0.375 ± 0.125 | - | - | 0.200 ± 0.000 | 0.375 ± 0.125 |"
    assert row in text
    assert reuse_study([Experiment("x", "x", 7, "acc")]) == {}  # no return scores: no reuse table


@pytest.mark.parametrize("stream", list(SUITES))
def test_the_reuse_suites_run_the_committed_levers_at_their_bytes(stream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each experiment is one lever of the committed table, 5 seeds, on a stream whose maps return every 5 tasks and
    that scores them (``returns``); the learner each builds holds the state bytes of ``BYTES``."""
    monkeypatch.chdir(ROOT)
    suite = load_suite(SUITES[stream])
    assert sorted({t.seed for t in suite.trials}) == [0, 1, 2, 3, 4]
    held = {}
    for trial in [t for t in suite.trials if t.seed == 0]:
        cli = cli_main(trial.fit_args(ROOT / "logs" / "unused")[1:], run=False)
        assert cli.datamodule.num_tasks == 25
        assert cli.datamodule.recur_every == (None if stream == "revise" else 5)
        assert cli.datamodule.revisions == (stream == "revise")
        held[suite.labels[trial.name]] = memory_bytes(cli.model).budget
    assert held == BYTES[stream]
    role = "revised" if stream == "revise" else "return"
    assert role in {s.role for _, slots in cli.datamodule.eval_items(5) for s in slots}


@pytest.mark.slow  # one AssociativeRecall fit: ~25 s
def test_a_reuse_cell_regenerates_the_benchmark_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The delta rule on recurring maps, seed 0, through the suite's own arguments: the values the former
    benchmarks/lifelong_reuse.py gave for seed 0 (forward, before first visit, first visit, first and last return)."""
    monkeypatch.chdir(ROOT)
    trial = next(t for t in load_suite(SUITES["recall"]).trials if t.name == "delta_rule" and t.seed == 0)
    cli = cli_main([*trial.fit_args(tmp_path)[1:], "--callbacks.checkpoint=null"], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    scalars = read_scalars(trial.log_dir(tmp_path))
    forward = [scalars["eval/forward_acc"][step] for step in sorted(scalars["eval/forward_acc"])]
    visits = [np.mean(list(scalars[f"eval/return_acc/visit_{n}"].values())) for n in (0, 1, 4)]
    assert [np.mean(forward[5:]), np.mean(forward[:5]), *visits] == pytest.approx([1.0, 1.0, 0.0546875, 0.85, 1.0])
    assert scalars["memory/budget_bytes"][max(scalars["memory/budget_bytes"])] == 5_120
