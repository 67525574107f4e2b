"""The Markdown of ``table.md`` (and ``table.csv``), written by ``python -m cl_lightning report``.

The main table (one row per experiment, final-window scores beside the paper's), then the paper's windows beside
ours (:func:`window_table`, every one in ``windows.csv``) and, for long runs the paper
gives no windows for, the scores per block of evaluated tasks (:func:`block_table`). Each cell is a mean ±
population std over seeds of each seed's mean (:mod:`cl_lightning.study.results`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cl_lightning.contract import EvalSlot, metric_key
from cl_lightning.study.results import FIGURE4_RANK, HESSIAN_RANK, Experiment, PaperWindows, block_stats, spread_of


def _pm(mean: float, std: float, decimals: int | None = None) -> str:
    """``0.679 ± 0.012``: three significant digits (MSEs reach 0.001) unless ``decimals`` is given, the std to the
    mean's last digit; the mean alone when the std is NaN (one seed), ``—`` when the mean is."""
    if math.isnan(mean):
        return "—"
    if decimals is None:  # three significant digits, at least three decimals
        decimals = max(3, 2 - math.floor(math.log10(abs(mean)))) if mean else 3
    return f"{mean:.{decimals}f}" if math.isnan(std) else f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def _spread(stats: tuple[float, float, int], decimals: int | None = None) -> str:
    """:func:`_pm` of a block's ``(mean, std, seeds)``: the mean alone for one seed, ``—`` for none."""
    mean, std, n = stats
    return _pm(mean if n else math.nan, spread_of(std, n), decimals)


def _of(n: int, seeds: int) -> str:
    """`` (n of N seeds)`` when some but not all seeds have a value, else nothing."""
    return f" ({n} of {seeds} seeds)" if 0 < n < seeds else ""


COLUMNS = ("learner", "seeds", "tasks", "forward", "paper", "backward", "paper", "online", "ACC", "BWT", "FWT",
           "forgetting", "s/task", "paper s/task", "peak GiB", "departures from the paper config")  # fmt: skip
"""The main table's columns (``table.md``; ``table.csv`` holds the numbers behind them)."""


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]], numbers_from: int | None = None) -> list[str]:
    """A Markdown table's lines (every table of the report's): the head, its rule (numbers, right-aligned, from column
    ``numbers_from`` on), a line per row."""
    rule = "".join("---:|" if numbers_from is not None and i >= numbers_from else "---|" for i in range(len(head)))
    return ["| " + " | ".join(head) + " |", "|" + rule, *("| " + " | ".join(row) + " |" for row in rows)]


def write_table(rows: Sequence[dict[str, Any]], out: Path) -> str:
    """Write ``table.csv``; return the Markdown of ``table.md`` (``main`` writes it once, with the window tables)."""
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = []
    for r in rows:
        seeds = f"{r['seeds']} ({r['unfinished']} unfinished)" if r["unfinished"] else str(r["seeds"])
        cells = [r["label"], seeds, str(r["tasks"])]
        cells += [
            _pm(r["forward_mean"], r["forward_std"]) + _of(r.get("final_seeds", 0), r["seeds"]),
            r["forward_paper"],
        ]
        cells += [_pm(r["backward_mean"], r["backward_std"]), r["backward_paper"]]
        cells += [_pm(r[f"{k}_mean"], r[f"{k}_std"]) for k in ("online", "avg", "bwt", "fwt", "forgetting")]
        cells += [_pm(r["seconds_per_task"], math.nan, 2), r["seconds_per_task_paper"]]  # s/task, GiB: no std
        table.append([*cells, _pm(r["peak_rss_gib"], math.nan, 2), r.get("departures", "not compared")])
    metric = rows[0]["metric"]
    notes = (
        f"\nForward, backward and online: {metric}, mean ± std over seeds of each seed's mean over the final window "
        "(last `max(T // 80, 5)` tasks), from the seeds whose runs reached it (`n of N seeds` where not all did; the "
        "mean alone where one has). ACC, BWT, FWT, forgetting: the "
        "last row of the probe-set matrix R. "
        "s/task: the trial's wall time (all attempts, evaluation and monitors included) per task; peak GiB: the "
        "fit process's peak resident memory. The paper's values are read from its figures (± 1 point, ± 0.02 MSE) "
        "at its full length: they compare with a run of the same length only. Departures: resolved config values "
        "the runs change from their experiment's paper config (`departures.md`).\n"
    )
    return "\n".join(markdown_table(COLUMNS, table)) + "\n" + notes


def _markdown(cells: dict[tuple[str, str], dict[int, str]], columns: dict[int, str]) -> list[str]:
    """A ``learner | score | <columns>`` table of ``{(label, score): {column: cell}}``, ``—`` where one is missing."""
    rows = [[label, score, *(c.get(k, "—") for k in columns)] for (label, score), c in cells.items()]
    return markdown_table(["learner", "score", *columns.values()], rows)


SHOWN_EVERY = 5
"""The window table shows every ``SHOWN_EVERY``-th window (and the first and the last) once more than
``2 * SHOWN_EVERY`` windows were reached; ``windows.csv`` holds all of them."""

WindowStats = dict[tuple[str, str], dict[int, tuple[tuple[float, float, int], Any, int]]]


def window_stats(experiments: Sequence[Experiment], paper: dict[str, PaperWindows]) -> WindowStats:
    """``{(label, score): {window: ((mean, std, n), paper value, seeds)}}`` for every window the paper was read at
    and some seed's run reached (its last task); the scores: forward, backward and, where the report derived it, the
    effective rank as Figure 4 draws it."""
    out: WindowStats = {}
    for exp in experiments:
        windows = paper.get(exp.name)
        tags = {role: metric_key(EvalSlot(role), exp.metric) for role in ("forward", "backward")}
        if FIGURE4_RANK in exp.curves:  # the rank as Figure 4 draws it (report.add_figure4_rank)
            tags["effective_rank"] = FIGURE4_RANK
        for role, tag in tags.items() if windows is not None else ():
            read = zip(windows.at, windows.scores.get(role) or [], strict=False)
            values = {w: v for w, v in read if not (isinstance(v, float) and math.isnan(v))}  # NaN: not read
            stats = block_stats(exp, tag, windows.window, values)
            for w, st in stats.items():
                out.setdefault((exp.label, role), {})[w] = (st, values[w], len(exp.seeds))
    return out


def shown_windows(windows: Sequence[int]) -> list[int]:
    """The windows the Markdown table shows (:data:`SHOWN_EVERY`)."""
    ws = sorted(windows)
    if len(ws) <= 2 * SHOWN_EVERY:
        return ws
    return sorted({ws[0], ws[-1], *(w for w in ws if w % SHOWN_EVERY == 0)})


def window_table(experiments: Sequence[Experiment], paper: dict[str, PaperWindows], out: Path | None = None) -> str:
    """Markdown: per experiment with paper windows, ours (:func:`window_stats`) beside the paper's reading at the
    windows :func:`shown_windows` picks; empty when no run reached one. With ``out``, all go to ``out/windows.csv``."""
    stats = window_stats(experiments, paper)
    if not stats:
        return ""
    size = next(iter(paper.values())).window
    reached: dict[tuple[str, str], dict[int, str]] = {}
    for key, cells in stats.items():
        for w, (st, value, seeds) in cells.items():
            paper_value = f"{value[0]:.2f}–{value[1]:.2f}" if isinstance(value, list) else f"{value:.3g}"
            reached.setdefault(key, {})[w] = f"{_spread(st, 3)} / {paper_value}{_of(st[2], seeds)}"
    every = sorted({w for c in reached.values() for w in c})
    shown = shown_windows(every)
    columns = {w: f"window {w} ({w * size}–{(w + 1) * size - 1})" for w in shown}
    note = (
        f"\nOurs / the paper's, per {size}-task window of evaluated tasks: ours is the mean ± std (population) over "
        "seeds of each seed's window mean (seeds whose run reached the window's end; the mean alone for one seed); "
        "the paper's is read off its figure (about ± 3 points; `cl_lightning/study/published.yaml`, `windows`)."
    )
    if len(shown) < len(every):
        note += f" Every {SHOWN_EVERY}th window of the {len(every)} reached, and the last: all are in `windows.csv`."
    if out is not None:
        fields = ["learner", "score", "window", "first_task", "last_task", "mean", "std", "seeds", "paper_low"]
        with open(out / "windows.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow([*fields, "paper_high"])
            for (label, score), cells in stats.items():
                for w, ((mean, std, n), value, _) in sorted(cells.items()):
                    low, high = value if isinstance(value, list) else (value, value)
                    row = [label, score, w, w * size, (w + 1) * size - 1, mean, spread_of(std, n), n, low, high]
                    writer.writerow(row)
    return "\n".join(_markdown(reached, columns)) + "\n" + note + "\n"


def _block_rows(exp: Experiment, block: int) -> dict[str, dict[int, tuple[float, float, int]]]:
    """``{score: {block: stats}}`` of one experiment: forward, backward and, where logged, the Hessian rank."""
    blocks = range(exp.num_evaluated_tasks // block)
    tags = {role: metric_key(EvalSlot(role), exp.metric) for role in ("forward", "backward")}
    if not np.isnan(exp.rows(HESSIAN_RANK)).all():
        tags["Hessian effective rank"] = HESSIAN_RANK
    return {score: block_stats(exp, tag, block, blocks) for score, tag in tags.items()}


def block_table(experiments: Sequence[Experiment], paper: dict[str, PaperWindows], block: int = 100) -> str:
    """Markdown: per experiment without paper windows whose runs reached two ``block``-task blocks, its scores per
    block (:func:`~cl_lightning.study.results.block_stats`); empty when none qualifies or ``block`` is 0."""
    cells: dict[tuple[str, str], dict[int, str]] = {}
    metrics = []
    for exp in experiments if block > 0 else ():
        scores = _block_rows(exp, block) if exp.name not in paper else {}
        if len(scores.get("forward", ())) < 2:
            continue
        metrics.append(exp.metric)
        for score, stats in scores.items():
            if any(n for _, _, n in stats.values()):  # a score never logged gets no row
                cells[(exp.label, score)] = {b: _spread(s) + _of(s[2], len(exp.seeds)) for b, s in stats.items()}
    if not cells:
        return ""
    order = ["forward", "backward", "Hessian effective rank"]  # one score's learners together
    cells = dict(sorted(cells.items(), key=lambda kv: order.index(kv[0][1])))
    columns = {b: f"{b * block}–{(b + 1) * block - 1}" for b in sorted({b for c in cells.values() for b in c})}
    note = (
        f"\nPer {block}-task block of evaluated tasks (`--block`), for the experiments without the paper's windows: "
        "mean ± std over seeds of each seed's mean over the block (population std, as everywhere in this file), "
        "over the seeds whose run reached the block's last task (n of N seeds when not all did; the mean alone for "
        f"one seed); a trailing partial block is left out. Forward and backward: {', '.join(dict.fromkeys(metrics))}"
        f", as in the main table; Hessian effective rank: `{HESSIAN_RANK}`, averaged over the tasks it was measured "
        "at.\n"
    )
    return "\n".join(_markdown(cells, columns)) + "\n" + note
