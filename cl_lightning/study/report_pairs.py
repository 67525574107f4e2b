"""The learned-against-fixed section of the report: each trained learner beside the fixed kernel at its support.

Query-only attention is framed as kNN with a learned metric, so the question a reader asks first is whether the
learned score beats a fixed one given the same supports. A suite names, per learner, the experiment of the fixed
kernel at its support (``kernel:`` in the suite file); the report pairs them over the seeds both ran and the tasks
both reached, on the forward score (the episode's queries after the task is learned):

- **windows**: the learner's plot windows (``T // 80`` tasks, :attr:`~cl_lightning.study.results.Experiment.window`)
  that some seed completed in both runs, and in how many of them the learner's mean is better (higher accuracy, lower
  MSE) than the kernel's, each window's means over the same seeds: those that completed it in both runs (``seeds``:
  every seed that did so somewhere);
- **final**: the learner's final window as ``table.csv`` has it (its finished seeds), and the kernel's over the same
  window and seeds.

``pairs.csv`` holds one row per pair; ``report --pairs FILE`` also writes the suite's rows into ``FILE``, which
gathers several suites (``docs/results/learned_vs_fixed/pairs.csv``), replacing that suite's earlier rows.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from cl_lightning.study.report_tables import markdown_table
from cl_lightning.study.results import Experiment, final_window, last_logged, spread_of

COLUMNS = (
    "suite", "learner", "stream", "support", "kernel", "seeds", "windows", "windows_learner_better", "window_tasks",
    "final_seeds", "learner_final", "learner_final_std", "kernel_final", "kernel_final_std", "metric",
)  # fmt: skip
KERNEL_TAGS = ("knn/k", "knn/gaussian", "knn/standardised")


def support_of(config: dict[str, Any]) -> int | None:
    """The supports an episode is answered from: the learner's ``support_size`` cut to the data's ``context_size``
    (``None`` for a learner without a support set: Backprop, CBP)."""
    support = (config.get("model", {}).get("init_args") or {}).get("support_size")
    context = config.get("data", {}).get("context_size")
    if support is None:
        return None
    return int(min(support, context)) if context is not None else int(support)


def _config(suite_dir: Path, exp: Experiment) -> dict[str, Any]:
    path = suite_dir / exp.name / f"seed_{exp.seeds[0]}" / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def kernel_name(exp: Experiment) -> str:
    """The kernel a kNN experiment served: its label, with the kernel each seed chose on its warm-up tasks."""
    rows = {tag: last_logged(exp.rows(tag))[:, 0] for tag in KERNEL_TAGS}
    if any(np.isnan(r).all() for r in rows.values()):
        return exp.label
    chosen = []
    for i, seed in enumerate(exp.seeds):
        k, gaussian, standardised = (float(rows[tag][i]) for tag in KERNEL_TAGS)
        if math.isnan(k):
            continue
        weights = "gaussian" if gaussian else "1/d"
        chosen.append(f"seed {seed}: k={int(k) or 'all'} {weights}{' standardised' if standardised else ''}")
    return f"{exp.label} ({'; '.join(chosen)})"


def _complete_windows(rows: np.ndarray, window: int) -> np.ndarray:
    """``(seeds, windows)`` means of the complete ``window``-task windows (NaN where a seed lacks a task)."""
    n = rows.shape[1] // window
    blocks = rows[:, : n * window].reshape(rows.shape[0], n, window)
    return np.where(np.isnan(blocks).any(axis=2), np.nan, blocks.mean(axis=2))


def pair_row(learner: Experiment, kernel: Experiment, suite_dir: Path, suite: str) -> dict[str, Any]:
    """One pair's row of ``pairs.csv`` (see the module's docstring)."""
    seeds = [s for s in learner.seeds if s in kernel.seeds]
    tasks = min(learner.num_evaluated_tasks, kernel.num_evaluated_tasks)
    ours = learner.score("forward")[[learner.seeds.index(s) for s in seeds], :tasks]
    theirs = kernel.score("forward")[[kernel.seeds.index(s) for s in seeds], :tasks]
    window = learner.window
    a, b = _complete_windows(ours, window), _complete_windows(theirs, window)
    paired = ~(np.isnan(a) | np.isnan(b))  # (seeds, windows): the seed completed the window in both runs
    both = paired.any(axis=0)
    with np.errstate(invalid="ignore"):  # each window's mean over the seeds that completed it in both
        a_mean = np.where(paired, a, 0.0).sum(axis=0)[both] / paired.sum(axis=0)[both]
        b_mean = np.where(paired, b, 0.0).sum(axis=0)[both] / paired.sum(axis=0)[both]
    better = a_mean > b_mean if learner.metric == "acc" else a_mean < b_mean
    seeds = [s for s, used in zip(seeds, paired.any(axis=1), strict=True) if used]
    final = max(window, min(learner.num_evaluated_tasks, 5))  # table.csv's final window
    l_mean, l_std, n = final_window(learner.score("forward"), final)
    end = learner.num_evaluated_tasks
    finished = [s for s, v in zip(learner.seeds, learner.score("forward")[:, end - 1], strict=True) if not np.isnan(v)]
    k_mean, k_std, k_n = math.nan, math.nan, 0
    if end <= kernel.num_evaluated_tasks and (paired := [kernel.seeds.index(s) for s in finished if s in kernel.seeds]):
        k_mean, k_std, k_n = final_window(kernel.score("forward")[paired, :end], final)
    return {
        "suite": suite,
        "learner": learner.label,
        "stream": learner.stream or "",
        "support": support_of(_config(suite_dir, learner)) or "",
        "kernel": kernel_name(kernel),
        "seeds": " ".join(str(s) for s in seeds),
        "windows": int(both.sum()),
        "windows_learner_better": int(better.sum()),
        "window_tasks": window,
        "final_seeds": n if k_n == n else f"{n} (kernel: {k_n})",
        "learner_final": l_mean,
        "learner_final_std": spread_of(l_std, n),
        "kernel_final": k_mean,
        "kernel_final_std": spread_of(k_std, k_n),
        "metric": learner.metric,
    }


def pair_rows(experiments: Sequence[Experiment], meta: dict[str, Any], suite_dir: Path) -> list[dict[str, Any]]:
    """The rows of the pairs ``suite.yaml`` names (``kernels``: learner -> kernel experiment) that both have runs."""
    found = {exp.name: exp for exp in experiments}
    suite = str(meta.get("name") or suite_dir.name)
    return [
        pair_row(found[learner], found[kernel], suite_dir, suite)
        for learner, kernel in (meta.get("kernels") or {}).items()
        if learner in found and kernel in found
    ]


def _cell(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def pairs_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The pairs as a Markdown table: final values as mean ± std, windows as "better in n of N"."""
    head = (
        "learner",
        "stream",
        "support",
        "fixed kernel",
        "seeds",
        "learner better in",
        "learner final",
        "kernel final",
    )

    def final(row: dict[str, Any], who: str) -> str:
        mean, std = row[f"{who}_final"], row[f"{who}_final_std"]
        return _cell(mean) + ("" if math.isnan(std) else f" ± {std:.3f}")

    body = [
        [r["learner"], r["stream"], str(r["support"] or "-"), r["kernel"], r["seeds"],
         f"{r['windows_learner_better']} of {r['windows']} windows of {r['window_tasks']}",
         final(r, "learner"), final(r, "kernel")]
        for r in rows
    ]  # fmt: skip
    return "\n".join([*markdown_table(head, body), ""])


def _write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def merge_pairs(rows: Sequence[dict[str, Any]], path: Path, suite: str) -> None:
    """Write ``rows`` into the gathered ``pairs.csv`` at ``path``: the other suites' rows kept, this suite's
    replaced."""
    kept: list[dict[str, Any]] = []
    if path.exists():
        with path.open(newline="") as f:
            kept = [r for r in csv.DictReader(f) if r["suite"] != suite]
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_csv([*kept, *rows], path)


def write_pairs(
    experiments: Sequence[Experiment], meta: dict[str, Any], suite_dir: Path, out: Path, gathered: Path | None
) -> str:
    """Write ``pairs.csv`` under ``out`` (and the suite's rows into ``gathered``) when the suite names kernels;
    the Markdown section for ``table.md`` (empty otherwise)."""
    rows = pair_rows(experiments, meta, suite_dir)
    if not rows:
        return ""
    _write_csv(rows, out / "pairs.csv")
    if gathered is not None:
        merge_pairs(rows, gathered, rows[0]["suite"])
    return "## Learned against fixed, at equal support\n\n" + pairs_markdown(rows)
