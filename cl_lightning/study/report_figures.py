"""The figures of ``python -m cl_lightning report``: every experiment of a suite on one axis, mean ± std over seeds.

``forward_backward.png`` and ``online.png`` (the paper's Figures 1–3, :func:`~cl_lightning.study.results.seed_band`,
the paper's windows beside the lines), ``hessian_eff_rank.png`` (raw, min–max normalised per seed, and as the
authors' scripts draw Figure 4) and ``matrix_<experiment>.png`` (the probe-set matrix R).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from cl_lightning.contract import EvalSlot, metric_key, online_key, parse_metric_key
from cl_lightning.metrics.figures import accuracy_matrix_figure
from cl_lightning.study.results import (
    FIGURE4_RANK,
    HESSIAN_RANK,
    Experiment,
    PaperWindows,
    minmax_per_seed,
    seed_band,
)

_NAMES = {"acc": "accuracy", "mse": "MSE"}
Panel = tuple[Callable[[str], str], str]
"""A curve panel: the logged name of a metric's series (from :mod:`cl_lightning.contract`) and the title."""
CURVES: dict[str, list[Panel]] = {
    "forward_backward.png": [
        (partial(metric_key, EvalSlot("forward")), "forward (current task)"),
        (partial(metric_key, EvalSlot("backward")), "backward (past task)"),
    ],
    "online.png": [(online_key, "online (prequential)")],
}


def _band(
    ax: Axes, x: np.ndarray, mean: np.ndarray, std: np.ndarray, colour: str, label: str, marker: str | None
) -> None:
    """A mean line and its ± std band, as the curves and the rank figure draw them."""
    ax.plot(x, mean, color=colour, lw=1.4, marker=marker, label=label)
    ax.fill_between(x, mean - std, mean + std, color=colour, alpha=0.15, lw=0)


def _curve(ax: Axes, exp: Experiment, rows: np.ndarray, window: int, colour: str) -> None:
    """One experiment's mean and ± std over seeds, per ``window`` tasks (nothing when it never logged the tag)."""
    if np.isnan(rows).all():
        return
    x, mean, std = seed_band(rows, window)
    per = f", {window}-task windows" if window > 1 else ""
    seeds = f"{len(exp.seeds)} seed{'s' if len(exp.seeds) > 1 else ''}"
    done = int((~np.isnan(rows[:, -1])).sum())  # the seeds whose runs reached the last task
    if done < len(exp.seeds):
        seeds += f", {done} to the end"
    _band(ax, x, mean, std, colour, f"{exp.label} ({seeds}{per})", "." if x.size < 40 else None)


MSE_FLOOR = 1e-3  # bottom of a log-scale MSE axis


def _colours(experiments: Sequence[Experiment]) -> dict[str, str]:
    return {exp.name: f"C{i % 10}" for i, exp in enumerate(experiments)}


def lag_text(lag: int | list[int] | None) -> str:
    """What the backward score reads: ``task t − 5``, or ``mean of tasks t − 1 … t − 5`` for several lags."""
    if lag is None:
        return "a past task"
    if isinstance(lag, int):
        return f"task t − {lag}"
    return f"mean of tasks t − {min(lag)} … t − {max(lag)}"


def _empty_reason(experiments: Sequence[Experiment], role: str | None) -> str:
    """Why a panel has no curve: the backward lag reaches past every run's tasks, or the score was not logged."""
    lags = [e.backward_lag for e in experiments if e.backward_lag is not None]
    first = min((lag if isinstance(lag, int) else min(lag)) for lag in lags) if lags else None
    most = max(e.num_evaluated_tasks for e in experiments)
    if role == "backward" and first is not None and most <= first:
        return f"no backward score yet: {most} evaluated task{'s' * (most > 1)}, and task t − {first} needs more"
    return "not logged by any run"


PAPER_LINE_FROM = 20
"""A paper curve read at more windows than this is drawn as a dashed line, at fewer as points."""


def _paper_windows(ax: Axes, exp: Experiment, paper: PaperWindows, role: str, colour: str, xmax: float) -> None:
    """The paper's points of one experiment on a panel (range reads as error bars), within the axis; a curve read at
    many windows (the paper's 75 on Permuted MNIST) as a dashed line beside ours."""
    x, mid, half = paper.points(role)
    keep = x <= xmax
    if keep.any():
        figure = paper.figures.get(role, paper.figure)
        label = f"{exp.label}: paper, Fig. {figure} ({paper.window}-task windows)"
        if keep.sum() > PAPER_LINE_FROM:
            ax.plot(x[keep], mid[keep], ls="--", lw=1.2, color=colour, alpha=0.9, label=label)
        else:
            ax.errorbar(x[keep], mid[keep], yerr=half[keep], fmt="D", ms=4, mfc="none", color=colour, label=label)


def curves_figure(
    experiments: Sequence[Experiment],
    panels: Sequence[Panel],
    paper: dict[str, PaperWindows] | None = None,
    chance: float | None = None,
) -> Figure:
    """One panel per ``(key, title)``, all experiments on each (``key(m)``: the tag of metric ``m``), the ``paper``
    windows and the ``chance`` level beside them; a panel with no curve says why."""
    entries = len(experiments) + len(paper or {}) + (chance is not None)
    bottom = 0.75 + 0.17 * (math.ceil(entries / 3) + 1)  # inches: tick labels, then the legend's title and rows
    width, height = 6.2 * len(panels), 3.6 + bottom
    fig = Figure(figsize=(width, height), dpi=110)
    fig.subplots_adjust(left=0.7 / width, right=1 - 0.1 / width, bottom=bottom / height, top=1 - 0.3 / height)
    fig.subplots_adjust(wspace=0.2)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colours, paper = _colours(experiments), paper or {}
    metrics = {exp.metric for exp in experiments}
    xmax = max(exp.num_evaluated_tasks for exp in experiments) - 0.5
    lags = {str(e.backward_lag) for e in experiments if e.backward_lag is not None}
    lag = next(e.backward_lag for e in experiments if e.backward_lag is not None) if len(lags) == 1 else None
    roles = []
    for ax, (key, title) in zip(axes, panels, strict=True):
        slot = next((parse_metric_key(key(m), m) for m in sorted(metrics) if parse_metric_key(key(m), m)), None)
        role = slot.role if slot is not None else None
        roles.append(role)
        for exp in experiments:
            _curve(ax, exp, exp.rows(key(exp.metric)), exp.window, colours[exp.name])
        drawn = bool(ax.lines)
        for exp in experiments:
            if exp.name in paper and role is not None:
                _paper_windows(ax, exp, paper[exp.name], role, colours[exp.name], xmax)
        if chance is not None and metrics == {"acc"}:
            ax.axhline(chance, color="0.4", ls=":", lw=1, label=f"chance ({chance:g})")
        if not drawn:
            ax.text(0.5, 0.5, _empty_reason(experiments, role), ha="center", transform=ax.transAxes, fontsize=9)
        ax.set_title(f"{title}: {lag_text(lag)}" if role == "backward" else title)
        ax.set_xlim(-0.5, xmax)
        ax.set_xlabel("evaluated task")
        ax.set_ylabel(" / ".join(_NAMES.get(m, m) for m in sorted(metrics)))
        if metrics == {"mse"}:  # log scale, floored at 1e-3: an exact answer (MSE ~1e-16) would squash the rest
            ax.set_yscale("log")
            ax.set_ylim(bottom=max(ax.get_ylim()[0], MSE_FLOOR))
        ax.grid(alpha=0.3)
    handles = {}
    for ax in axes:  # one legend for all panels, each entry once
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    title = "lines: mean ± std over seeds" + (f"; backward = score on {lag_text(lag)}" if "backward" in roles else "")
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=7, title=title)
    return fig


def rank_figure(experiments: Sequence[Experiment], paper: dict[str, PaperWindows] | None = None) -> Figure | None:
    """Hessian effective rank at the tasks where it was measured: raw, min–max normalised per seed over its
    measurements, and, where the report derived it (:data:`FIGURE4_RANK`), as the authors' scripts draw Figure 4
    (rank / seed max, the tasks before their first measurement at 0; window means) with the paper's curve dashed."""
    measured = [e for e in experiments if not np.isnan(e.rows(HESSIAN_RANK)).all()]
    if not measured:
        return None
    authors = [e for e in measured if FIGURE4_RANK in e.curves]
    fig = Figure(figsize=(6.2 * (2 + bool(authors)), 4.2), dpi=110)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.12, top=0.91, wspace=0.15)
    raw, norm, *rest = fig.subplots(1, 2 + bool(authors))
    colours = _colours(experiments)
    for exp in measured:
        rows = exp.rows(HESSIAN_RANK)
        keep = ~np.isnan(rows).all(axis=0)  # only the tasks where it was measured
        tasks = np.flatnonzero(keep)
        for ax, values in ((raw, rows[:, keep]), (norm, minmax_per_seed(rows[:, keep]))):
            at, mean, std = seed_band(values, 1)  # `at`: indices into the measured tasks
            if not at.size:  # normalised: fewer than two measurements in every seed
                continue
            _band(ax, tasks[at.astype(int)], mean, std, colours[exp.name], exp.label, ".")
    if not any(line.get_label() in {e.label for e in measured} for line in norm.lines):
        why = "Hessian measured once per seed:\nmin–max normalisation needs two or more measurements"
        norm.text(0.5, 0.5, why, ha="center", transform=norm.transAxes, fontsize=9)
    raw.set_title("Hessian effective rank (last layer)")
    norm.set_title("min–max normalised per seed over its measurements")
    for exp in authors:
        assert paper is not None  # FIGURE4_RANK is derived from the paper's windows
        windows = paper[exp.name]
        at, mean, std = seed_band(exp.rows(FIGURE4_RANK), windows.window)
        _band(rest[0], at, mean, std, colours[exp.name], exp.label, ".")
        _paper_windows(rest[0], exp, windows, "effective_rank", colours[exp.name], exp.num_evaluated_tasks)
    if authors:
        fill = paper[authors[0].name].rank_zero_fill if paper else 0
        rest[0].set_title(
            f"as the authors' scripts draw Figure 4: rank / seed max, first {fill} tasks at 0", fontsize=9
        )
        rest[0].legend(fontsize=7, loc="best")
    for ax in (raw, norm, *rest):
        ax.set_xlim(-0.5, max(exp.num_evaluated_tasks for exp in experiments) - 0.5)
        ax.set_xlabel("evaluated task")
        ax.grid(alpha=0.3)
    raw.legend(fontsize=7, loc="best")
    return fig


def matrix_figure(exp: Experiment) -> Figure | None:
    """The probe-set matrix R averaged over seeds (cells no seed measured stay blank)."""
    probes = exp.slots("matrix")
    if not probes:
        return None
    # (seeds, rows = probe tasks, cols = probe tasks): R[i, j] logged at the end of probe task i
    stacked = np.stack([exp.score("matrix", j)[:, probes] for j in probes], axis=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # cells no seed measured
        mean = np.nanmean(stacked, axis=0)
    fig = accuracy_matrix_figure(mean, probes, None, exp.metric)
    fig.axes[0].set_title(f"{exp.label}: {exp.metric} matrix R[i, j], mean of {len(exp.seeds)} seeds", fontsize=9)
    return fig


def write_figures(
    experiments: Sequence[Experiment], out: Path, paper: dict[str, PaperWindows], chance: float | None
) -> list[str]:
    """Draw every figure into ``out`` (the paper's windows and the chance line on the curves); the names written."""
    figures: dict[str, Figure | None] = {
        name: curves_figure(experiments, panels, paper, chance) for name, panels in CURVES.items()
    }
    figures["hessian_eff_rank.png"] = rank_figure(experiments, paper)
    figures |= {f"matrix_{exp.name}.png": matrix_figure(exp) for exp in experiments}
    written = []
    for name, fig in figures.items():
        if fig is not None:
            fig.savefig(out / name)
            written.append(name)
    return written
