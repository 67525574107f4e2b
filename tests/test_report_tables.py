"""The per-window and per-block tables of ``table.md``, on experiments built in memory (cells worked by hand)."""

from __future__ import annotations

import numpy as np
import pytest

from cl_lightning.study.report_tables import block_table, shown_windows, window_table
from cl_lightning.study.results import Experiment, PaperWindows

FWD, BWD, RANK = "eval/forward_mse", "eval/backward_mse", "hessian/eff_rank"


def _seed(tasks: int, reached: int, blocks: dict[str, list[float]], lag: int = 5) -> dict[str, np.ndarray]:
    """One seed's curves: per tag a constant per 100-task block, NaN after task ``reached - 1``; backward starts at
    task ``lag``, the Hessian is measured every 10 tasks; ``epoch`` marks the tasks the run reached."""
    curves = {tag: np.repeat(values, 100)[:tasks].astype(float) for tag, values in blocks.items()}
    curves["epoch"] = np.arange(tasks, dtype=float)
    if BWD in curves:
        curves[BWD][:lag] = np.nan
    if RANK in curves:
        curves[RANK][np.arange(tasks) % 10 != 0] = np.nan
    for curve in curves.values():
        curve[reached:] = np.nan
    return curves


def _experiment(name: str, label: str, tasks: int, seeds: list[dict[str, np.ndarray]]) -> Experiment:
    exp = Experiment(name, label, tasks, "mse", stream="SlowlyChangingRegression")
    for seed, curves in enumerate(seeds):
        exp.add(seed, curves, {})
    return exp


def _suite() -> tuple[list[Experiment], dict[str, PaperWindows]]:
    """Backprop: 250 tasks (2 complete blocks, the partial 200-249 left out), 3 seeds, the third stopped after task
    149; CBP: 200 tasks, 1 seed, MSEs below 0.1, no Hessian; QOA: the paper's windows; kNN: 300 tasks but its one
    seed stopped after task 149 (1 complete block)."""
    bp = _experiment(
        "bp",
        "Backprop",
        250,
        [
            _seed(250, 250, {FWD: [0.1, 0.3, 0.3], BWD: [1.0, 2.0, 2.0], RANK: [4.0, 3.0, 3.0]}),
            _seed(250, 250, {FWD: [0.3, 0.5, 0.5], BWD: [3.0, 4.0, 4.0], RANK: [6.0, 5.0, 5.0]}),
            _seed(250, 150, {FWD: [0.2, 0.2, 0.2], BWD: [2.0, 2.0, 2.0], RANK: [5.0, 5.0, 5.0]}),
        ],
    )
    cbp = _experiment("cbp", "CBP", 200, [_seed(200, 200, {FWD: [0.034, 0.036], BWD: [0.05, 0.05]})])
    qoa = _experiment("qoa_v1", "QOA", 250, [_seed(250, 250, {FWD: [0.1, 0.1, 0.1], BWD: [0.2, 0.2, 0.2]})])
    knn = _experiment("knn", "kNN", 300, [_seed(300, 150, {FWD: [0.7, 0.7, 0.7], BWD: [0.8, 0.8, 0.8]})])
    paper = {"qoa_v1": PaperWindows(100, [0, 1], {"forward": [0.1, 0.1]}, "1")}
    return [bp, cbp, qoa, knn], paper


def test_block_table_cells_are_mean_and_population_std_over_seeds_of_block_means() -> None:
    """Backprop block 0 (3 seeds): forward 0.1, 0.3, 0.2 -> 0.2 ± sqrt(0.02 / 3) = 0.0816; backward (tasks 5-99)
    1, 3, 2 -> 2 ± sqrt(2 / 3) = 0.816; rank (tasks 0, 10, ..., 90) 4, 6, 5 -> 5 ± 0.816. Block 1: seed 2 stopped,
    so 2 of 3 seeds: forward 0.3, 0.5 -> 0.4 ± 0.1; backward 2, 4 -> 3 ± 1; rank 3, 5 -> 4 ± 1. CBP, one seed: the
    mean alone, to three significant digits. QOA (paper windows) and kNN (one complete block) get no rows."""
    experiments, paper = _suite()
    text = block_table(experiments, paper)
    assert text.splitlines()[:7] == [
        "| learner | score | 0–99 | 100–199 |",
        "|---|---|---|---|",
        "| Backprop | forward | 0.200 ± 0.082 | 0.400 ± 0.100 (2 of 3 seeds) |",
        "| CBP | forward | 0.0340 | 0.0360 |",
        "| Backprop | backward | 2.000 ± 0.816 | 3.000 ± 1.000 (2 of 3 seeds) |",
        "| CBP | backward | 0.0500 | 0.0500 |",
        "| Backprop | Hessian effective rank | 5.000 ± 0.816 | 4.000 ± 1.000 (2 of 3 seeds) |",
    ]
    assert text.splitlines()[7] == ""
    note = text.splitlines()[8]
    assert note.startswith("Per 100-task block of evaluated tasks (`--block`)")
    assert "mean ± std over seeds of each seed's mean over the block (population std" in note
    assert "Forward and backward: mse" in note


def test_block_table_with_other_blocks_and_off() -> None:
    """Blocks of 125 tasks: Backprop has 2. Block 0-124, forward: seed 0 (100 · 0.1 + 25 · 0.3) / 125 = 0.14, seed 1
    0.34, seed 2 0.2 -> 0.22667 ± sqrt((0.08667² + 0.11333² + 0.02667²) / 3) = 0.0838; block 125-249: seed 2 stopped
    before its end. CBP (200 tasks) has one block, so no row; kNN none; block 0 turns the table off."""
    experiments, paper = _suite()
    lines = block_table(experiments, paper, block=125).splitlines()
    assert lines[0] == "| learner | score | 0–124 | 125–249 |"
    assert lines[2] == "| Backprop | forward | 0.227 ± 0.084 | 0.400 ± 0.100 (2 of 3 seeds) |"
    assert lines[3].startswith("| Backprop | backward |")
    assert lines[5] == ""
    assert block_table(experiments, paper, block=0) == ""
    assert block_table(experiments[2:], paper) == ""  # QOA has the paper's windows, kNN one block


def test_window_table_cells_gain_the_std_over_seeds() -> None:
    """QOA's windows (paper 0.35, 0.45): 3 seeds over 200 tasks, forward per window (0.30, 0.40), (0.34, 0.44),
    (0.38, -): the third stopped after task 149. Window 0: 0.34 ± sqrt(0.0032 / 3) = 0.0327; window 1: 2 of 3
    seeds, 0.42 ± 0.02."""
    seeds = [
        _seed(200, 200, {"eval/forward_acc": [0.30, 0.40]}),
        _seed(200, 200, {"eval/forward_acc": [0.34, 0.44]}),
        _seed(200, 150, {"eval/forward_acc": [0.38, 0.38]}),
    ]
    exp = Experiment("qoa_v1", "QOA", 200, "acc")
    for seed, curves in enumerate(seeds):
        exp.add(seed, curves, {})
    paper = {"qoa_v1": PaperWindows(100, [0, 1, 2], {"forward": [0.35, 0.45, 0.55]}, "1")}
    lines = window_table([exp], paper).splitlines()
    assert lines[:3] == [
        "| learner | score | window 0 (0–99) | window 1 (100–199) |",
        "|---|---|---|---|",
        "| QOA | forward | 0.340 ± 0.033 / 0.35 | 0.420 ± 0.020 / 0.45 (2 of 3 seeds) |",
    ]
    assert len(lines) == 5  # no backward row: the paper has no backward windows here
    assert "ours is the mean ± std (population) over seeds of each seed's window mean" in lines[4]
    assert block_table([exp], paper) == ""  # the paper's windows: no block table


def test_window_table_of_the_papers_75_windows_shows_every_fifth_and_the_csv_all(tmp_path) -> None:
    """7,500 tasks, two seeds (forward 0.5 and 0.7; backward from task 5), the paper read at all 75 windows: the
    Markdown shows windows 0, 5, ..., 70 and the last, 74 (16 columns); ``windows.csv`` has every window of both
    scores, ours (0.6 ± 0.1 over 2 seeds) beside the paper's (a range read as its low and high)."""
    import csv

    seeds = [_seed(7500, 7500, {"eval/forward_acc": [v] * 75, "eval/backward_acc": [v] * 75}) for v in (0.5, 0.7)]
    exp = Experiment("qoa_v1", "QOA", 7500, "acc")
    for seed, curves in enumerate(seeds):
        exp.add(seed, curves, {})
    forward = [round(0.3 + 0.007 * w, 3) for w in range(75)]
    backward: list = [[0.31, 0.34], *forward[1:]]
    paper = {"qoa_v1": PaperWindows(100, list(range(75)), {"forward": forward, "backward": backward}, "1")}
    lines = window_table([exp], paper).splitlines()
    shown = [*range(0, 75, 5), 74]
    assert shown_windows(range(75)) == shown
    header = " | ".join(f"window {w} ({w * 100}–{w * 100 + 99})" for w in shown)
    assert lines[0] == f"| learner | score | {header} |"
    assert lines[1] == "|" + "---|" * (len(shown) + 2)
    assert lines[2].startswith("| QOA | forward | 0.600 ± 0.100 / 0.3 | 0.600 ± 0.100 / 0.335 |")
    assert lines[3].startswith("| QOA | backward | 0.600 ± 0.100 / 0.31–0.34 |")
    assert lines[2].endswith("| 0.600 ± 0.100 / 0.818 |")
    assert "all are in `windows.csv`" in lines[5]
    assert window_table([exp], paper, tmp_path)
    with open(tmp_path / "windows.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 150
    assert [r["window"] for r in rows[:75]] == [str(w) for w in range(75)]
    first = rows[75]  # backward, window 0: the paper's range
    assert (first["score"], first["first_task"], first["last_task"], first["seeds"]) == ("backward", "0", "99", "2")
    assert (float(first["mean"]), float(first["std"])) == pytest.approx((0.6, 0.1))
    assert (first["paper_low"], first["paper_high"]) == ("0.31", "0.34")
    assert window_table([exp], {}, tmp_path / "none") == ""
    assert not (tmp_path / "none").exists()


def test_few_windows_are_all_shown() -> None:
    assert shown_windows([0, 1, 2, 3, 4, 5, 6, 8, 10]) == [0, 1, 2, 3, 4, 5, 6, 8, 10]
    assert shown_windows([3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]) == [3, 5, 10, 13]


def test_published_pmnist_curves_have_all_75_windows_and_the_figure_draws_them_as_a_line() -> None:
    """Figure 1's five curves (Backprop, CBP, QOA V1, V2, full attention) at every window 0-74, accuracies, the
    effective rank of Figure 4 beside them; a 7,500-task run's forward panel draws the paper's curve as a dashed
    line of 75 points at the window centres."""
    from cl_lightning.study.report import paper_points, published_numbers
    from cl_lightning.study.report_figures import CURVES, curves_figure

    methods = published_numbers()["benchmarks"]["pmnist"]["methods"]
    for name in ("bp", "cbp", "qoa_v1", "qoa_v2", "full_attention"):
        windows = methods[name]["windows"]
        assert windows["at"] == list(range(75)), name
        for role in ("forward", "backward"):
            values = np.array([np.mean(v) for v in windows[role]])
            assert len(values) == 75, (name, role)
            assert ((values > 0.1) & (values < 0.95)).all(), (name, role)
        assert len(methods[name]["effective_rank"]["windows"]) == 75, name
    exp = Experiment("qoa_v1", "QOA", 7500, "acc", stream="PermutedMNIST", published="qoa_v1", backward_lag=5)
    exp.add(0, _seed(7500, 7500, {"eval/forward_acc": [0.5] * 75, "eval/backward_acc": [0.5] * 75}), {})
    paper = paper_points([exp], {"benchmark": "pmnist"})
    assert len(paper["qoa_v1"].at) == 75
    forward = curves_figure([exp], CURVES["forward_backward.png"], paper, 0.1).axes[0]
    (line,) = [ln for ln in forward.lines if ln.get_label().endswith("paper, Fig. 1 (100-task windows)")]
    assert line.get_linestyle() == "--"
    np.testing.assert_allclose(line.get_xdata(), np.arange(75) * 100 + 49.5)
    assert line.get_ydata()[0] == pytest.approx(0.35)
    assert line.get_ydata()[-1] == pytest.approx(0.867, abs=0.02)


def test_rank_figure_draws_figure_4_as_the_authors_scripts_do_beside_the_papers_curve() -> None:
    """Backprop's Hessian rank measured every 100 tasks over 7,500 (1, 2, ..., 75): the third panel is Figure 4 as the
    authors' scripts draw it (carried forward, the first 95 tasks at 0, divided by the seed's largest, 100-task
    window means) with the paper's 75-window curve dashed; without paper windows, two panels and ours only."""
    from cl_lightning.study.report import add_figure4_rank, paper_points
    from cl_lightning.study.report_figures import rank_figure

    exp = Experiment("bp", "Backprop", 7500, "acc", stream="PermutedMNIST", published="bp", backward_lag=5)
    rank = np.full(7500, np.nan)
    rank[::100] = np.arange(1.0, 76.0)
    exp.add(0, {"eval/forward_acc": np.full(7500, 0.8), "hessian/eff_rank": rank}, {})
    paper = paper_points([exp], {"benchmark": "pmnist"})
    assert paper["bp"].figures == {"effective_rank": "4 (left)"}
    assert paper["bp"].rank_zero_fill == 95
    add_figure4_rank([exp], paper)
    _, norm, authors = rank_figure([exp], paper).axes
    assert [line.get_label() for line in norm.lines] == ["Backprop"]
    labels = [line.get_label() for line in authors.lines]
    assert labels == ["Backprop", "Backprop: paper, Fig. 4 (left) (100-task windows)"]
    ours, theirs = authors.lines
    assert ours.get_ydata()[0] == pytest.approx(5 / 100 / 75)  # 95 zeros, then rank 1 carried over tasks 95-99
    np.testing.assert_allclose(ours.get_ydata()[1:], np.arange(2.0, 76.0) / 75)
    assert theirs.get_linestyle() == "--"
    assert np.isnan(theirs.get_ydata()[0])  # window 0: not read (the curves' first segments overlap)
    assert len(theirs.get_xdata()) == 75
    plain = Experiment("bp", "Backprop", 7500, "acc")
    plain.add(0, {"hessian/eff_rank": rank}, {})
    assert [line.get_label() for line in rank_figure([plain]).axes[1].lines] == ["Backprop"]
    assert len(rank_figure([plain]).axes) == 2
    from cl_lightning.study.report_tables import window_stats

    stats = window_stats([exp], paper)[("Backprop", "effective_rank")]  # windows.csv's rows of it
    assert 0 not in stats  # the paper's window 0 is not read
    (mean, _, n), value, _ = stats[1]
    assert (mean, n, value) == (pytest.approx(2 / 75), 1, paper["bp"].scores["effective_rank"][1])
    assert sorted(stats) == list(range(1, 75))
