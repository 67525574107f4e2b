"""The reuse study's section of the report: what a learner does with keys that come back, a value revised or a map
that returns (the data module's ``returns`` and ``revisions``; findings: ``docs/results/lifelong_icl.md`` §2).

One row per experiment that logged them: stream, learner, bytes held and each score's mean ± std over seeds
(:func:`~cl_lightning.study.report_budget.seed_mean_std`; ``-`` where its stream has none):

- **forward** / **revised keys** / **stale answers**: the current map's queries after its task, the revised keys'
  queries answered with the new value / the old one (``eval/revised_{m}``, ``eval/stale_{m}``), from task
  ``SETTLED`` on (the maps have settled);
- **before first visit**: a map not yet shown (``eval/return_{m}/visit_0``, tasks 1 .. k-1): what nothing kept gives;
- **first visit**: the forward score of the first k tasks, what the first return is read against;
- **return recall, first / last**: a returning map before it is shown again, at its first return (visit 1, tasks
  k .. 2k-1) and its last (the highest visit logged): a rise measures consolidation over repeated exposures.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cl_lightning.study.report_budget import bytes_held, mean_std, seed_mean_std
from cl_lightning.study.report_tables import markdown_table
from cl_lightning.study.results import Experiment

SETTLED = 5
"""Forward, revised and stale are read from this task on (the maps have settled)."""
COLUMNS = ("stream", "learner", "state bytes", "forward", "revised keys", "stale answers", "before first visit",
           "first visit", "return recall, first", "last")  # fmt: skip
SCORES = ("forward", "revised", "stale", "before_first", "first_visit", "return_first", "return_last")


def reuse_cell(exp: Experiment) -> dict[str, Any]:
    """One experiment's row: bytes held and each score's mean and std over seeds (``<score>`` / ``<score>_std``;
    NaN where the stream has no such score)."""
    rows = {role: exp.score(role)[:, SETTLED:] for role in ("forward", "revised", "stale")}
    visits = exp.slots("return")
    if visits:
        before = exp.score("return", 0)
        recur = int((~np.isnan(before)).sum(axis=1).max()) + 1  # visit 0 is logged before tasks 1 .. k-1
        rows["before_first"], rows["first_visit"] = before, exp.score("forward")[:, :recur]
        rows["return_first"], rows["return_last"] = exp.score("return", 1), exp.score("return", visits[-1])
    out: dict[str, Any] = {"bytes": bytes_held(exp), "seeds": len(exp.seeds)}
    for name in SCORES:
        out[name], out[f"{name}_std"] = seed_mean_std(rows[name]) if name in rows else (np.nan, np.nan)
    return out


def reuse_study(experiments: Sequence[Experiment]) -> dict[str, dict[str, Any]]:
    """The cells by experiment name (with its label and stream), for the experiments that logged return scores."""
    return {
        exp.name: {"label": exp.label, "stream": exp.stream or "", **reuse_cell(exp)}
        for exp in experiments
        if any(exp.slots(role) for role in ("return", "revised", "stale"))  # logged return or revision scores
    }


def reuse_markdown(cells: dict[str, dict[str, Any]]) -> str:
    """The reuse table: a row per experiment."""
    rows = [
        [c["stream"], c["label"], "-" if c["bytes"] is None else f"{c['bytes']:,}"]
        + [mean_std(c[name], c[f"{name}_std"]) for name in SCORES]
        for c in cells.values()
    ]
    return "\n".join([*markdown_table(COLUMNS, rows, 2), ""])


def write_reuse(experiments: Sequence[Experiment], out: Path) -> str:
    """Write ``reuse.md`` and ``reuse.json`` under ``out`` when experiments logged reuse scores; the Markdown
    section for ``table.md`` (empty otherwise)."""
    cells = reuse_study(experiments)
    if not cells:
        return ""
    text = reuse_markdown(cells)
    (out / "reuse.md").write_text(text)
    (out / "reuse.json").write_text(json.dumps({"cells": cells}, indent=1))
    return "## Reuse study: revised keys and maps that return\n\n" + text
