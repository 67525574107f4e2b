"""The report's reading and aggregation, on event files written by hand (values checked against hand arithmetic)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from cl_lightning.study.report import (
    chance_level,
    load_suite_runs,
    main,
    paper_points,
    paper_text,
    per_task,
    published_numbers,
    read_scalars,
    table_rows,
)
from cl_lightning.study.report_tables import write_table
from cl_lightning.study.results import Experiment, final_window, last_value, minmax_per_seed, seed_band

STEPS = 10  # training steps per task: task t ends at step 10 t + 9, where Lightning logs its epoch-end values


def _write(log_dir: Path, values: dict[str, dict[int, float]], order: int = 0) -> None:
    """Write ``{tag: {task: value}}`` as Lightning does (value and ``epoch`` at the task's last step) into a file
    whose name sorts as a run started ``order``-th (resumed runs write a second, later file)."""
    writer = SummaryWriter(str(log_dir))
    tasks = sorted({t for series in values.values() for t in series})
    for task in tasks:
        step = STEPS * task + STEPS - 1
        for tag, series in values.items():
            if task in series:
                writer.add_scalar(tag, series[task], step)
        writer.add_scalar("epoch", task, step)
    writer.close()
    (path,) = [p for p in log_dir.glob("events.out.tfevents.*") if ".order" not in p.name]
    path.rename(log_dir / f"events.out.tfevents.{1_700_000_000 + order}.host.1.order{order}")


def _trial(
    suite: Path, name: str, seed: int, tasks: int, values: dict[str, dict[int, float]], warmup: int = 0, **record
) -> Path:
    d = suite / name / f"seed_{seed}"
    d.mkdir(parents=True)
    stream = {"class_path": "x.PermutedMNIST", "init_args": {"num_tasks": tasks, "warmup_tasks": warmup}}
    (d / "config.yaml").write_text(yaml.safe_dump({"trainer": {"max_epochs": tasks}, "data": {"stream": stream}}))
    _write(d, values)
    if record:
        (d / "trial.json").write_text(json.dumps(record))
    return d


def test_per_task_maps_steps_through_the_epoch_scalar_and_a_resume_overwrites(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    _write(d, {"eval/forward_acc": {0: 0.1, 1: 0.2, 2: 0.3}, "hessian/eff_rank": {0: 5.0}}, order=0)
    # a resumed run redoes tasks 2 and 3 (after the task-1 checkpoint): its values win
    _write(d, {"eval/forward_acc": {2: 0.35, 3: 0.4}}, order=1)
    curves = per_task(read_scalars(d), num_evaluated_tasks=5)
    np.testing.assert_allclose(curves["eval/forward_acc"], [0.1, 0.2, 0.35, 0.4, np.nan], rtol=1e-6)
    np.testing.assert_allclose(curves["hessian/eff_rank"], [5.0, np.nan, np.nan, np.nan, np.nan])
    np.testing.assert_array_equal(curves["epoch"], [0, 1, 2, 3, np.nan])


def test_seed_band_is_the_window_mean_of_per_task_mean_and_std() -> None:
    # 2 seeds x 6 tasks, windows of 3; task 1 of seed 1 missing (NaN)
    rows = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [3.0, np.nan, 5.0, 4.0, 9.0, 8.0]])
    centres, mean, std = seed_band(rows, 3)
    # per task: means 2, 2, 4, 4, 7, 7; population stds 1, 0, 1, 0, 2, 1
    np.testing.assert_allclose(centres, [1.0, 4.0])
    np.testing.assert_allclose(mean, [(2 + 2 + 4) / 3, (4 + 7 + 7) / 3])
    np.testing.assert_allclose(std, [(1 + 0 + 1) / 3, (0 + 2 + 1) / 3])


def test_final_window_and_last_value_and_minmax() -> None:
    rows = np.array([[0.0, 0.5, 0.6, 0.8], [0.2, 0.1, 0.7, 0.9], [np.nan, np.nan, np.nan, np.nan]])
    mean, std, n = final_window(rows, 2)  # seeds' window means 0.7 and 0.8; the third seed has none
    assert (round(mean, 9), round(std, 9), n) == (0.75, 0.05, 2)
    mean, std, n = last_value(np.array([[1.0, 2.0, np.nan], [np.nan, 4.0, np.nan]]))
    assert (mean, std, n) == (3.0, 1.0, 2)
    np.testing.assert_allclose(
        minmax_per_seed(np.array([[2.0, 4.0, 3.0], [1.0, 1.0, np.nan]])), [[0, 1, 0.5], [np.nan] * 3]
    )


def test_paper_values_carry_figure_and_page() -> None:
    paper = published_numbers()
    bp = paper["benchmarks"]["pmnist"]["methods"]["bp"]
    assert paper_text(bp["forward"]) == "0.68 (Fig. 1a, p. 8)"
    assert paper_text(bp["backward"]) == "0.33–0.36 (Fig. 1b, p. 8)"
    for bench in paper["benchmarks"].values():
        for method in bench["methods"].values():
            for key in ("forward", "backward"):
                assert {"end", "figure", "page"} <= set(method[key]), method
            assert {"hours", "tasks", "table", "page"} <= set(method["wall_clock"])


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "toy"
    suite.mkdir()
    (suite / "suite.yaml").write_text(
        yaml.safe_dump({"experiments": ["bp", "knn"], "labels": {"bp": "Backprop"}, "published": {"bp": "bp"}})
    )
    forward = {0: [0.5, 0.6, 0.7, 0.8, 0.9], 1: [0.3, 0.4, 0.5, 0.6, 0.7]}  # the two seeds of bp
    for seed, fwd in forward.items():
        values = {
            "eval/forward_acc": dict(enumerate(fwd)),
            "eval/backward_acc": {t: fwd[t] - 0.2 for t in range(1, 5)},  # lag 1
            "train/online_acc": dict(enumerate(fwd)),
            "forgetting/avg": {0: 0.5, 4: 0.6 + 0.2 * seed},
            "eval/acc_matrix/task_0": {0: 0.5, 4: 0.1 * seed},
            "eval/acc_matrix/task_4": {4: 0.9},
            "cost/task_seconds": dict.fromkeys(range(5), 0.25),
        }
        attempt = {"wall_seconds": 10.0 * (seed + 1), "peak_rss_bytes": 2**30 * (seed + 1)}
        _trial(suite, "bp", seed, 5, values, status="finished", attempts=[attempt])
    _trial(suite, "knn", 0, 10, {"eval/forward_acc": dict.fromkeys(range(10), 0.8)})
    # seed 1 stopped after task 1: no final window, and its partial R (ACC) is left out
    _trial(suite, "knn", 1, 10, {"eval/forward_acc": {0: 0.2, 1: 0.3}, "forgetting/avg": {1: 0.3}})
    _trial(
        suite,
        "knn",
        2,
        10,
        {"forgetting/avg": {9: 0.7}},
        status="finished",
        attempts=[{"wall_seconds": 20.0, "peak_rss_bytes": 2**30}],
    )
    return suite


def test_table_of_a_hand_made_suite(tmp_path: Path) -> None:
    experiments, meta = load_suite_runs(_suite(tmp_path))
    assert [e.name for e in experiments] == ["bp", "knn"]  # suite order
    bp, knn = table_rows(experiments, meta)
    assert (bp["label"], bp["seeds"], bp["tasks"], bp["final_window"]) == ("Backprop", 2, 5, 5)
    # final window = the last max(5 // 80, 5) = 5 tasks: seed means 0.7 and 0.5
    assert bp["forward_mean"] == pytest.approx(0.6)
    assert bp["forward_std"] == pytest.approx(0.1)
    # backward over tasks 1..4: seed means 0.55 and 0.35
    assert bp["backward_mean"] == pytest.approx(0.45)
    assert bp["backward_std"] == pytest.approx(0.1)
    assert bp["avg_mean"] == pytest.approx(0.7)
    assert bp["avg_std"] == pytest.approx(0.1)
    assert bp["seconds_per_task"] == pytest.approx(15.0 / 5)
    assert bp["train_seconds_per_task"] == pytest.approx(0.25)
    assert bp["peak_rss_gib"] == pytest.approx(1.5)
    assert bp["forward_paper"] == "0.68 (Fig. 1a, p. 8)"
    assert bp["seconds_per_task_paper"] == "2.4 (Tab. 5, p. 15)"  # 5 h / 7,500 tasks
    assert bp["unfinished"] == 0
    assert (knn["seeds"], knn["unfinished"]) == (3, 1)
    # one seed with a value (the unfinished seed has none in the final window, seed 2 logged no forward score):
    # no spread, so the table prints the mean alone, never a "± 0.000" that reads as two seeds agreeing
    assert knn["avg_mean"] == pytest.approx(0.7)
    assert np.isnan(knn["avg_std"])
    assert knn["forward_mean"] == pytest.approx(0.8)
    assert np.isnan(knn["forward_std"])
    table = write_table([bp, knn], tmp_path).splitlines()
    assert table[2].startswith("| Backprop | 2 | 5 | 0.600 ± 0.100 | 0.68 (Fig. 1a, p. 8) | 0.450 ± 0.100 |")
    assert table[3].startswith("| knn | 3 (1 unfinished) | 10 | 0.800 (1 of 3 seeds) |  | — |")  # the final: says whose
    assert knn["final_seeds"] == 1
    assert knn["forward_paper"] == ""
    assert knn["seconds_per_task"] == pytest.approx(20.0 / 10)  # finished trials with a record only


def test_a_warmup_trial_is_read_from_its_first_evaluated_task(tmp_path: Path) -> None:
    """2 warm-up epochs of 5: epochs 2..4 are tasks 0..2; warm-up values (training only) are dropped; the wall
    time is spread over all 5 stream tasks."""
    suite = tmp_path / "warm"
    values = {
        "eval/forward_acc": {2: 0.4, 3: 0.5, 4: 0.6},
        "train/online_acc": {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, 4: 0.5},
    }
    attempt = {"wall_seconds": 50.0, "peak_rss_bytes": 2**30}
    _trial(suite, "bp", 0, 5, values, warmup=2, status="finished", attempts=[attempt])
    (exp,), meta = load_suite_runs(suite)
    assert (exp.num_evaluated_tasks, exp.warmup_tasks) == (3, 2)
    np.testing.assert_allclose(exp.rows("eval/forward_acc"), [[0.4, 0.5, 0.6]], rtol=1e-6)
    np.testing.assert_allclose(exp.rows("train/online_acc"), [[0.3, 0.4, 0.5]], rtol=1e-6)
    (row,) = table_rows([exp], meta)
    assert row["tasks"] == 3
    assert row["forward_mean"] == pytest.approx(0.5)
    assert row["seconds_per_task"] == pytest.approx(50.0 / 5)


def test_report_writes_figures_and_table(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    assert main([str(suite)]) == 0
    out = suite / "report"
    names = {p.name for p in out.iterdir()}
    assert {"table.md", "table.csv", "forward_backward.png", "online.png", "matrix_bp.png"} <= names
    assert "hessian_eff_rank.png" not in names  # no run measured it
    md = (out / "table.md").read_text()
    assert "| Backprop | 2 | 5 | 0.600 ± 0.100 | 0.68 (Fig. 1a, p. 8) | 0.450 ± 0.100 |" in md
    assert md.splitlines()[2].endswith("| 1.50 | paper config unknown |")  # suite.yaml names no paper config
    assert (
        "## Backprop (`bp`)\n\nPaper config: unknown.\n\nDepartures: paper config unknown.\n"
        in (out / "departures.md").read_text()
    )
    from cl_lightning.study.report_figures import matrix_figure

    bp = load_suite_runs(suite)[0][0]
    fig = matrix_figure(bp)
    image = fig.axes[0].images[0].get_array()
    # R averaged over the 2 seeds: row "after 0" = (0.5, -), row "after 4" = (mean(0, 0.1), 0.9)
    np.testing.assert_allclose(image.filled(np.nan), [[0.5, np.nan], [0.05, 0.9]], rtol=1e-6)


def test_report_block_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--block 2`` on a 5-task experiment without paper windows: blocks 0-1 and 2-3 (task 4 left out); seed 1
    stopped after task 1. Block 0: seeds 0.15 and 0.3 -> 0.225 ± 0.075; block 1: seed 0 alone, 0.35. ``--block 0``
    writes no block table; a negative block is a one-line error."""
    suite = tmp_path / "toy"
    _trial(suite, "learner", 0, 5, {"eval/forward_acc": {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, 4: 0.5}})
    _trial(suite, "learner", 1, 5, {"eval/forward_acc": {0: 0.3, 1: 0.3}})
    assert main([str(suite), "--block", "2"]) == 0
    lines = (suite / "report" / "table.md").read_text().splitlines()
    head = lines.index("| learner | score | 0–1 | 2–3 |")
    assert lines[head + 2 :][:2] == ["| learner | forward | 0.225 ± 0.075 | 0.350 (1 of 2 seeds) |", ""]
    assert lines[head + 4].startswith("Per 2-task block of evaluated tasks")
    assert main([str(suite), "--block", "0"]) == 0
    assert "block" not in (suite / "report" / "table.md").read_text()
    with pytest.raises(SystemExit) as stop:
        main([str(suite), "--block", "-1"])
    assert stop.value.code == 2
    assert "--block must be 0 (no per-block table) or a number of tasks, not -1" in capsys.readouterr().err


@pytest.mark.parametrize("metric", ["acc", "mse"])
def test_every_curve_panel_reads_the_keys_the_contract_names(tmp_path: Path, metric: str) -> None:
    """A suite logged under the contract's names (as learners log) fills every panel: a figure reading a key of its
    own that drifted from :mod:`cl_lightning.contract` would draw an empty panel."""
    from cl_lightning.contract import EvalSlot, metric_key, online_key
    from cl_lightning.study.report_figures import CURVES, curves_figure

    suite = tmp_path / "toy"
    keys = [metric_key(EvalSlot("forward"), metric), metric_key(EvalSlot("backward"), metric), online_key(metric)]
    for seed in (0, 1):
        _trial(suite, "learner", seed, 4, {key: dict.fromkeys(range(4), 0.5 + 0.1 * seed) for key in keys})
    (exp,) = load_suite_runs(suite)[0]
    assert exp.metric == metric
    panels = [key(metric) for figure in CURVES.values() for key, _ in figure]
    assert sorted(panels) == sorted(keys)
    for figure in CURVES.values():
        for ax in curves_figure([exp], figure).axes:
            (line,) = ax.lines
            np.testing.assert_allclose(line.get_ydata(), [0.55] * 4)  # the mean of the two seeds at each task


def _experiment(name: str, tasks: int, lag: int | list[int], value: float = 0.5) -> Experiment:
    exp = Experiment(name, name.upper(), tasks, "acc", stream="PermutedMNIST", published=name, backward_lag=lag)
    curves = {"eval/forward_acc": np.full(tasks, value), "eval/backward_acc": np.full(tasks, value)}
    curves["eval/backward_acc"][: lag if isinstance(lag, int) else min(lag)] = np.nan
    exp.add(0, curves, {})
    return exp


def test_forward_backward_figure_draws_the_papers_windows_chance_and_the_lag() -> None:
    """QOA V1 over 200 tasks: the paper's windows 0 and 1 (centres 49.5 and 149.5; window 0 of the backward curve is
    the range 0.31-0.34) beside our line, chance at 0.1, the lag in the title and the legend."""
    from cl_lightning.study.report_figures import CURVES, curves_figure

    exp = _experiment("qoa_v1", 200, 5)
    meta = {"benchmark": "pmnist"}
    paper = paper_points([exp], meta)
    assert chance_level([exp], meta) == 0.1
    fig = curves_figure([exp], CURVES["forward_backward.png"], paper, 0.1)
    forward, backward = fig.axes
    assert backward.get_title() == "backward (past task): task t − 5"
    for ax, ys in ((forward, [0.35, 0.45]), (backward, [0.325, 0.47])):
        lines = {line.get_label(): line for line in ax.lines}
        assert np.unique(lines["QOA_V1 (1 seed, 2-task windows)"].get_ydata()).tolist() == [0.5]
        np.testing.assert_allclose(lines["chance (0.1)"].get_ydata(), [0.1, 0.1])
        (points, _, _) = ax.containers[0]  # the errorbar: markers, caps, bars
        np.testing.assert_allclose(points.get_xdata(), [49.5, 149.5])
        np.testing.assert_allclose(points.get_ydata(), ys)
    (bars,) = backward.containers[0][2]  # the range of window 0: 0.325 +- 0.015, a point elsewhere
    np.testing.assert_allclose(bars.get_segments()[0][:, 1], [0.31, 0.34])
    np.testing.assert_allclose(bars.get_segments()[1][:, 1], [0.47, 0.47])
    legend = fig.legends[0]
    assert legend.get_title().get_text() == "lines: mean ± std over seeds; backward = score on task t − 5"
    assert [t.get_text() for t in legend.get_texts()] == [
        "QOA_V1 (1 seed, 2-task windows)",
        "chance (0.1)",
        "QOA_V1: paper, Fig. 1 (100-task windows)",
    ]


def test_empty_panels_say_why() -> None:
    from cl_lightning.study.report_figures import CURVES, curves_figure, lag_text, rank_figure

    fig = curves_figure([_experiment("bp", 3, 5)], CURVES["forward_backward.png"])
    assert fig.axes[1].texts[0].get_text() == "no backward score yet: 3 evaluated tasks, and task t − 5 needs more"
    assert not fig.axes[0].texts
    assert lag_text([1, 2, 3, 4, 5]) == "mean of tasks t − 1 … t − 5"
    exp = _experiment("bp", 50, 5)
    exp.curves["hessian/eff_rank"] = [np.where(np.arange(50) == 0, 7.0, np.nan)]  # measured once, at task 0
    raw, norm = rank_figure([exp]).axes
    assert len(raw.lines) == 1
    assert not norm.lines
    assert norm.texts[0].get_text() == (
        "Hessian measured once per seed:\nmin–max normalisation needs two or more measurements"
    )


def test_window_table_sets_our_window_means_beside_the_papers() -> None:
    """Seed 0 ran 200 tasks (forward 0.3 then 0.4 per window), seed 1 stopped at task 149 (forward 0.5): window 0
    averages both seeds (0.3 and 0.5: 0.4 ± 0.1 population std), window 1 only seed 0 (its mean alone), which the
    cell says."""
    from cl_lightning.study.report import window_table

    exp = _experiment("qoa_v1", 200, 5)
    exp.curves["eval/forward_acc"][0] = np.repeat([0.3, 0.4], 100)
    seed1 = {"eval/forward_acc": np.full(200, 0.5), "eval/backward_acc": np.full(200, 0.25)}
    for curve in seed1.values():
        curve[150:] = np.nan
    seed1["eval/backward_acc"][:5] = np.nan
    exp.add(1, seed1, {})
    text = window_table([exp], paper_points([exp], {"benchmark": "pmnist"}))
    assert text.splitlines()[:4] == [
        "| learner | score | window 0 (0–99) | window 1 (100–199) |",
        "|---|---|---|---|",
        "| QOA_V1 | forward | 0.400 ± 0.100 / 0.35 | 0.400 / 0.45 (1 of 2 seeds) |",
        "| QOA_V1 | backward | 0.375 ± 0.125 / 0.31–0.34 | 0.500 / 0.47 (1 of 2 seeds) |",
    ]
    assert window_table([exp], {}) == ""


@pytest.mark.parametrize("damage", ["overwritten", "truncated", "deleted"])
def test_report_names_damaged_event_files_and_marks_the_partial_row(
    damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#35: bytes overwritten mid-file showed the trial as merely "unfinished", a file truncated to half gave its
    partial values as results, a trial whose event files were deleted dropped out of the table, all silently."""
    suite = tmp_path / "toy"
    values = {"eval/forward_acc": {t: 0.1 * t for t in range(40)}}
    attempts = [{"wall_seconds": 1.0, "peak_rss_bytes": 2**20}]
    _trial(suite, "learner", 0, 40, values, status="finished", attempts=attempts)
    damaged = _trial(suite, "learner", 1, 40, values, status="finished", attempts=attempts)
    (events,) = damaged.glob("events.out.tfevents.*")
    raw = bytearray(events.read_bytes())
    if damage == "overwritten":
        raw[len(raw) // 2 : len(raw) // 2 + 16] = b"\xff" * 16
        events.write_bytes(bytes(raw))
    elif damage == "truncated":
        events.write_bytes(bytes(raw[: len(raw) // 2]))
    else:
        events.unlink()
    assert main([str(suite)]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("could not read")]
    why = {"overwritten": "fails its checksum", "truncated": "truncated at byte", "deleted": "no event file"}[damage]
    assert len(said) == 1, said
    assert str(damaged) in said[0]
    assert why in said[0], said
    table = (suite / "report" / "table.md").read_text()
    assert "learner (partial: seed_1 damaged)" in table
    assert "| 2 (1 unfinished) |" in table


def test_report_reads_a_single_fit_and_a_folder_of_fits_of_one_config(tmp_path: Path) -> None:
    """`report logs/<name>/version_N` is that run's table; `report logs/<name>` makes its runs the seeds of one
    experiment (seeds from their saved configs)."""
    from helpers import BACKPROP, fit

    for seed in (3, 4):
        fit(tmp_path, BACKPROP, tasks=2, extra=[f"--seed_everything={seed}"])
    runs = tmp_path / "logs" / "tiny"
    assert sorted(p.name for p in runs.iterdir()) == ["version_0", "version_1"]
    out = tmp_path / "one"
    assert main([str(runs / "version_1"), "--out", str(out), "--block", "0"]) == 0
    (row,) = list(csv.DictReader((out / "table.csv").open()))
    assert (row["experiment"], row["seeds"], row["tasks"]) == ("tiny", "1", "2")
    experiments, _ = load_suite_runs(runs)
    (exp,) = experiments
    assert (exp.name, exp.seeds, exp.num_evaluated_tasks) == ("tiny", [3, 4], 2)
    assert not np.isnan(exp.score("forward")).any()


def test_a_legend_says_how_many_seeds_reached_the_end() -> None:
    from cl_lightning.study.report_figures import CURVES, curves_figure

    exp = Experiment("qoa", "QOA", 4, "acc")
    exp.add(0, {"eval/forward_acc": np.array([0.1, 0.2, 0.3, 0.4])}, {})
    exp.add(1, {"eval/forward_acc": np.array([0.1, 0.2, np.nan, np.nan])}, {})  # stopped after task 1
    fig = curves_figure([exp], CURVES["forward_backward.png"])
    assert "QOA (2 seeds, 1 to the end)" in [t.get_text() for t in fig.legends[0].get_texts()]
