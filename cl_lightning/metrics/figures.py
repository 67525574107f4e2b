"""Figures of the forgetting metrics: the accuracy matrix R as a heatmap and the paper's forward / backward curves
beside each probe task's column of R. Drawn on matplotlib's ``Figure`` (no pyplot state), for the forgetting monitor
(TensorBoard's Images tab) and for ``report`` alike."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from cl_lightning.metrics.forgetting import window_means


def accuracy_matrix_figure(
    matrix: np.ndarray, probe_tasks: list[int], baseline: np.ndarray | None = None, metric: str = "acc"
) -> Figure:
    """Heatmap of ``R[i, j]`` (score on probe task j after training probe task i), NaN cells blank.

    With ``baseline`` an extra top row ``init`` shows the learner's score at initialisation (b of FWT).
    """
    rows = [f"after {t}" for t in probe_tasks]
    data = np.asarray(matrix, dtype=np.float64)
    if baseline is not None:
        data, rows = np.vstack([baseline[None], data]), ["init", *rows]
    k = len(probe_tasks)
    width, height = 3.1 + 0.55 * k, 1.4 + 0.45 * len(rows)
    fig = Figure(figsize=(width, height), dpi=100)
    # fixed margins in inches (tight_layout measured every label and took half the drawing time)
    fig.subplots_adjust(left=1.05 / width, right=1 - 0.75 / width, bottom=0.75 / height, top=1 - 0.4 / height)
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(data), cmap="viridis_r" if metric == "mse" else "viridis", aspect="auto")
    fig.colorbar(im, ax=ax, fraction=0.05)
    ax.set_xticks(range(k), [str(t) for t in probe_tasks], rotation=90 if k > 12 else 0)
    ax.set_yticks(range(len(rows)), rows)
    ax.set(xlabel="probe task j", title=f"{metric} matrix R[i, j]")
    if k <= 12:
        for (i, j), v in np.ndenumerate(data):
            if not math.isnan(v):
                bright = im.norm(v) > 0.6 if metric != "mse" else im.norm(v) < 0.4  # viridis is light at its top
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="k" if bright else "w")
    return fig


def transfer_curves_figure(
    forward: np.ndarray, backward: np.ndarray, matrix: np.ndarray, probe_tasks: list[int], metric: str = "acc"
) -> Figure:
    """Left: forward (current task) and backward (past task) score after every task, the paper's two curves; runs
    longer than 160 tasks are shown as means of ``len // 80``-task windows (about the paper's 75–100 points).
    Right: each probe task's score over training (a column of ``R``), its own task marked by a dot.
    """
    fig = Figure(figsize=(11, 4), dpi=100)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.92, wspace=0.18)
    left, right = fig.subplots(1, 2)
    window = max(1, forward.size // 80) if forward.size > 160 else 1
    per = f", mean of {window} tasks" if window > 1 else ""
    left.plot(*window_means(forward, window), label=f"forward (task t) {metric}{per}")
    left.plot(*window_means(backward, window), label=f"backward (past task) {metric}{per}")
    left.set(xlabel="task t", ylabel=metric, title="after each task")
    left.legend(loc="best", fontsize=8)
    rows = np.asarray(probe_tasks)
    for j, task in enumerate(probe_tasks):
        col = matrix[:, j]
        seen = ~np.isnan(col)
        if seen.any():
            (line,) = right.plot(rows[seen], col[seen], marker=".", label=f"task {task}")
            if task in rows[seen]:
                right.plot([task], [col[list(rows).index(task)]], "o", color=line.get_color())
    right.set(xlabel="after training task", title="probe tasks over training (columns of R)")
    if len(probe_tasks) <= 12:
        right.legend(loc="best", fontsize=7, ncol=2)
    return fig
