"""The figures of ``python -m cl_lightning report``: every experiment of a suite on one axis, mean ± std over seeds.

The paper's Figures 1–3 (forward and backward score over tasks, windows of ``T // 80`` tasks), the online score,
its Figure 4 (Hessian effective rank, min–max normalised per seed) and one accuracy-matrix heatmap per experiment.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from cl_lightning.callbacks.forgetting import accuracy_matrix_figure
from cl_lightning.contract import EvalSlot, metric_key, online_key, parse_metric_key
from cl_lightning.results import Experiment, minmax_per_seed, seed_band

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
"""The curve figures: file name and panels."""


def _band(ax: Axes, exp: Experiment, rows: np.ndarray, window: int, color: str) -> None:
    """One experiment's mean line and ± std band (nothing when it never logged the tag)."""
    if np.isnan(rows).all():
        return
    x, mean, std = seed_band(rows, window)
    per = f", {window}-task windows" if window > 1 else ""
    seeds = f"{len(exp.seeds)} seed{'s' if len(exp.seeds) > 1 else ''}"
    ax.plot(
        x,
        mean,
        color=color,
        lw=1.4,
        marker="." if x.size < 40 else None,
        label=f"{exp.label} ({seeds}{per})",
    )
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, lw=0)


MSE_FLOOR = 1e-3
"""Bottom of a log-scale MSE axis: smaller values (a learner answering exactly) are drawn on the floor."""


def _colours(experiments: Sequence[Experiment]) -> dict[str, str]:
    return {exp.name: f"C{i % 10}" for i, exp in enumerate(experiments)}


def curves_figure(experiments: Sequence[Experiment], panels: Sequence[Panel]) -> Figure:
    """One panel per ``(key, title)``, all experiments on each: ``key(m)`` is the tag of an experiment's metric."""
    fig = Figure(figsize=(6.2 * len(panels), 4.2), dpi=110)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.12, top=0.91, wspace=0.15)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colours = _colours(experiments)
    metrics = {exp.metric for exp in experiments}
    for ax, (key, title) in zip(axes, panels, strict=True):
        for exp in experiments:
            _band(ax, exp, exp.rows(key(exp.metric)), exp.window, colours[exp.name])
        ax.set_title(title)
        ax.set_xlim(-0.5, max(exp.num_tasks for exp in experiments) - 0.5)
        ax.set_xlabel("task")
        ax.set_ylabel(" / ".join(_NAMES.get(m, m) for m in sorted(metrics)))
        if metrics == {"mse"}:  # log scale, floored at 1e-3: an exact answer (MSE ~1e-16) would squash the rest
            ax.set_yscale("log")
            ax.set_ylim(bottom=max(ax.get_ylim()[0], MSE_FLOOR))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    return fig


def rank_figure(experiments: Sequence[Experiment]) -> Figure | None:
    """Hessian effective rank at the tasks where it was measured: raw, and min–max normalised per seed."""
    measured = [e for e in experiments if not np.isnan(e.rows("hessian/eff_rank")).all()]
    if not measured:
        return None
    fig = Figure(figsize=(12.4, 4.2), dpi=110)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.12, top=0.91, wspace=0.15)
    raw, norm = fig.subplots(1, 2)
    colours = _colours(experiments)
    for exp in measured:
        rows = exp.rows("hessian/eff_rank")
        keep = ~np.isnan(rows).all(axis=0)  # only the tasks where it was measured
        tasks = np.flatnonzero(keep)
        for ax, values in ((raw, rows[:, keep]), (norm, minmax_per_seed(rows[:, keep]))):
            at, mean, std = seed_band(values, 1)  # `at`: indices into the measured tasks
            x = tasks[at.astype(int)]
            ax.plot(x, mean, color=colours[exp.name], marker=".", lw=1.4, label=exp.label)
            ax.fill_between(x, mean - std, mean + std, color=colours[exp.name], alpha=0.15, lw=0)
    if not norm.lines:
        norm.text(0.5, 0.5, "needs two or more measurements per seed", ha="center", transform=norm.transAxes)
    raw.set_title("Hessian effective rank (last layer)")
    norm.set_title("min–max normalised per seed (the paper's Figure 4)")
    for ax in (raw, norm):
        ax.set_xlabel("task")
        ax.grid(alpha=0.3)
    raw.legend(fontsize=7, loc="best")
    return fig


def matrix_figure(exp: Experiment) -> Figure | None:
    """The probe-set matrix R averaged over seeds (cells no seed measured stay blank)."""
    slots = [parse_metric_key(tag, exp.metric) for tag in exp.curves]
    probes = sorted(slot.task for slot in slots if slot is not None and slot.role == "matrix")
    if not probes:
        return None
    # (seeds, rows = probe tasks, cols = probe tasks): R[i, j] logged at the end of probe task i
    keys = [metric_key(EvalSlot("matrix", j), exp.metric) for j in probes]
    stacked = np.stack([exp.rows(key)[:, probes] for key in keys], axis=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # cells no seed measured
        mean = np.nanmean(stacked, axis=0)
    fig = accuracy_matrix_figure(mean, probes, None, exp.metric)
    fig.axes[0].set_title(f"{exp.label}: {exp.metric} matrix R[i, j], mean of {len(exp.seeds)} seeds", fontsize=9)
    return fig


def write_figures(experiments: Sequence[Experiment], out: Path) -> list[str]:
    """Draw every figure into ``out``; return the file names written."""
    figures: dict[str, Figure | None] = {name: curves_figure(experiments, panels) for name, panels in CURVES.items()}
    figures["hessian_eff_rank.png"] = rank_figure(experiments)
    figures |= {f"matrix_{exp.name}.png": matrix_figure(exp) for exp in experiments}
    written = []
    for name, fig in figures.items():
        if fig is not None:
            fig.savefig(out / name)
            written.append(name)
    return written
