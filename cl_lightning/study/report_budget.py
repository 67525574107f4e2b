"""The budget study's section of the report: live recall at several lags against the context-memory bytes.

A suite whose experiments name a ``budget`` is a budget study: each experiment is one learner sized to one budget
B, a *buffer* learner (``memory_size`` in its saved config) or a *rule*. One row per experiment (:func:`cell`), the
P1 probe's references above them (:func:`references`), the crossovers under them (:func:`crossover`); a row whose
bytes held exceed its budget says so ("(over)"), and one seed's value prints without a spread. Findings:
``docs/results/lifelong_icl.md`` §1, §3, §4.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from cl_lightning.study.report_tables import markdown_table
from cl_lightning.study.results import Experiment, last_logged, last_value

COLUMNS = ("stream", "learner", "budget B", "bytes held", "forward")
PROBES = {"written": "written keys", "unseen": "unseen keys (rule)"}  # the P1 probe's slots and their columns
LAST = {"fast_weights/key_coherence": "key \\|cos\\|"}  # read after the last task (callbacks.KeyCoherenceMonitor)
REFERENCES = {  # the P1 probe's references (callbacks.RuleReferenceMonitor) and their rows
    "reference/least_squares_acc": "least squares on the task's examples",
    "reference/nearest_pair_acc": "nearest written pair (1-NN, unbounded)",
}


def references(experiments: Sequence[Experiment]) -> dict[str, dict[str, Any]]:
    """Each reference's unseen-key accuracy over the tasks the P1 probe scored (``eval/unseen_<m>`` logged), from
    the first experiment that logged the references (every run of a seed has the same stream):
    ``{label: {"stream", "unseen", "unseen_std"}}``."""
    for exp in experiments:
        if all(tag in exp.curves for tag in REFERENCES):
            scored = ~np.isnan(exp.score("unseen"))
            out = {}
            for tag, label in REFERENCES.items():
                mean, std = seed_mean_std(np.where(scored, exp.rows(tag), np.nan))
                out[label] = {"stream": exp.stream or "", "unseen": mean, "unseen_std": std}
            return out
    return {}


def holds_buffer(suite_dir: Path, experiment: str) -> bool:
    """Whether the experiment's learner keeps a replay buffer (its saved config sets ``memory_size``)."""
    for config in sorted((suite_dir / experiment).glob("seed_*/config.yaml")):
        model = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
        return "memory_size" in (model.get("init_args") or {})
    return False


def cell(exp: Experiment, lags: Sequence[int], probes: Sequence[str] = (), last: Sequence[str] = ()) -> dict[str, Any]:
    """One experiment's numbers: bytes held, forward after the last task, ``mean{L}`` / ``std{L}`` per lag,
    ``{probe}`` / ``{probe}_std`` per P1 probe slot and ``{tag}`` / ``{tag}_std`` per :data:`LAST` tag (each seed's
    value after its last task)."""
    out: dict[str, Any] = {"bytes": bytes_held(exp)}
    out["forward"], out["forward_std"] = seed_mean_std(last_logged(exp.score("forward")))
    out["seeds"] = len(exp.seeds)
    for lag in lags:
        out[f"mean{lag}"], out[f"std{lag}"] = seed_mean_std(exp.score("lag", lag))
    for probe in probes:
        out[probe], out[f"{probe}_std"] = seed_mean_std(exp.score(probe))
    for tag in last:
        out[tag], out[f"{tag}_std"] = seed_mean_std(last_logged(exp.rows(tag)))
    return out


def bytes_held(exp: Experiment) -> int | None:
    """``memory/budget_bytes`` after the last task (``None``: not logged), as the budget and reuse cells hold it."""
    held, _, _ = last_value(exp.rows("memory/budget_bytes"))
    return None if math.isnan(held) else round(held)


def seed_mean_std(rows: np.ndarray) -> tuple[float, float]:
    """Mean and population std over seeds of each seed's mean over its logged tasks (NaN: not logged; the std is NaN
    for one seed, which has no spread), correctly rounded (``statistics.fmean``: a tie at the table's third decimal
    prints the same whatever the order of the sum).

    >>> seed_mean_std(np.array([[np.nan, 0.25, 0.75], [np.nan, 1.0, 1.0]]))
    (0.75, 0.25)
    >>> seed_mean_std(np.array([[0.5, np.nan]]))
    (0.5, nan)
    """
    per_seed = [statistics.fmean(row[~np.isnan(row)].tolist()) for row in rows if (~np.isnan(row)).any()]
    if not per_seed:
        return math.nan, math.nan
    return statistics.fmean(per_seed), statistics.pstdev(per_seed) if len(per_seed) > 1 else math.nan


def crossover(cells: dict[str, dict[int, dict[str, Any]]], buffers: set[str], lag: int) -> int | None:
    """The smallest budget from which on the best buffer learner's mean recall at ``lag`` is at least the best
    rule's at every budget both were run at (None if the rules stay ahead at the largest).

    >>> cells = {"knn": {1: {"mean1": 0.1}, 4: {"mean1": 0.9}}, "delta": {1: {"mean1": 0.5}, 4: {"mean1": 0.6}}}
    >>> crossover(cells, {"knn"}, 1)
    4
    """
    found = None
    for budget in sorted({b for by_budget in cells.values() for b in by_budget}):
        ours = [cells[n][budget][f"mean{lag}"] for n in cells if n in buffers and budget in cells[n]]
        theirs = [cells[n][budget][f"mean{lag}"] for n in cells if n not in buffers and budget in cells[n]]
        if ours and theirs:
            found = (found or budget) if max(ours) >= max(theirs) else None
    return found


def _pair(mean: float, std: float) -> str:
    """``mean ± std`` to three decimals (``- ± -`` for a lag a learner did not log), the mean alone for one seed.

    >>> _pair(0.5, 0.25), _pair(0.5, math.nan), _pair(math.nan, math.nan)
    ('0.500 ± 0.250', '0.500', '- ± -')
    """
    if math.isnan(std) and not math.isnan(mean):
        return f"{mean:.3f}"
    return " ± ".join("-" if math.isnan(x) else f"{x:.3f}" for x in (mean, std))


def budget_study(suite_dir: Path, experiments: Sequence[Experiment], meta: dict[str, Any]) -> dict[str, Any]:
    """The cells by learner (experiment label) and budget, the buffer learners, the lags and the crossovers."""
    budgets = meta.get("budgets") or {}
    lags = sorted({lag for exp in experiments for lag in exp.slots("lag")})
    probes = [role for role in PROBES if any(exp.slots(role) for exp in experiments)]  # P1 slots, PROBES' order
    last = [tag for tag in LAST if any(tag in exp.curves for exp in experiments)]
    cells: dict[str, dict[int, dict[str, Any]]] = {}
    streams, buffers = {}, set()
    for exp in experiments:
        if exp.name not in budgets:
            continue
        by_budget = cells.setdefault(exp.label, {})
        by_budget[int(budgets[exp.name])] = {"experiment": exp.name, **cell(exp, lags, probes, last)}
        streams[exp.label] = exp.stream or ""
        if holds_buffer(suite_dir, exp.name):
            buffers.add(exp.label)
    cells = {name: dict(sorted(by_budget.items())) for name, by_budget in cells.items()}
    both = 0 < len(buffers) < len(cells)  # a crossover needs buffer learners and rules (the goals: rules only)
    cross = {lag: crossover(cells, buffers, lag) for lag in lags} if both else {}
    refs = references(experiments) if "unseen" in probes else {}
    study = {"cells": cells, "buffers": sorted(buffers), "streams": streams, "lags": lags, "crossover": cross}
    return study | {"probes": probes, "last": last, "references": refs}


def mean_std(mean: float, std: float) -> str:
    """A table cell ``mean ± std`` (``-`` where nothing was logged).

    >>> mean_std(0.5, 0.25), mean_std(math.nan, math.nan)
    ('0.500 ± 0.250', '-')
    """
    return "-" if math.isnan(mean) else _pair(mean, std)


def budget_markdown(study: dict[str, Any]) -> str:
    """The budget table (a row per learner and budget) and the crossover line."""
    lags, probes, last = study["lags"], study.get("probes", []), study.get("last", [])
    rows = []
    for name, ref in study.get("references", {}).items():  # not learners: no budget, bytes or memory; unseen keys last
        blank = ["-"] * (len(COLUMNS) + len(lags) + len(probes) - 3)  # the columns between learner and unseen keys
        rows.append([ref["stream"], name, *blank, _pair(ref["unseen"], ref["unseen_std"]), *["-"] * len(last)])
    for name, by_budget in study["cells"].items():
        for budget, c in by_budget.items():
            recall = [_pair(c[f"mean{lag}"], c[f"std{lag}"]) for lag in lags]
            recall += [_pair(c[p], c[f"{p}_std"]) for p in (*probes, *last)]
            held = "-" if c["bytes"] is None else f"{c['bytes']:,}" + (" (over)" if c["bytes"] > budget else "")
            forward = _pair(c["forward"], c["forward_std"])
            rows.append([study["streams"][name], name, f"{budget:,}", held, forward, *recall])
    head = [*COLUMNS, *(f"lag {lag}" for lag in lags), *(PROBES[p] for p in probes), *(LAST[t] for t in last)]
    lines = markdown_table(head, rows, 2)
    if not study["crossover"]:
        return "\n".join([*lines, ""])
    cross = ", ".join(f"lag {lag}: {'none' if b is None else f'{b:,} B'}" for lag, b in study["crossover"].items())
    stream = ", ".join(sorted(set(study["streams"].values())))
    return "\n".join([*lines, "", f"Crossover ({stream}; buffer learners: {', '.join(study['buffers'])}): {cross}", ""])


def budget_figure(study: dict[str, Any], path: Path) -> None:
    """One panel per lag: mean recall against the bytes held (log scale), a line per learner, the std as a band."""
    from matplotlib.figure import Figure  # only when drawing: the sweep imports the report to read trial states

    lags = study["lags"]
    fig = Figure(figsize=(5 * len(lags), 4), dpi=110)
    axes = fig.subplots(1, len(lags), sharey=True, squeeze=False)[0]
    for ax, lag in zip(axes, lags, strict=True):
        for name, by_budget in study["cells"].items():
            cells = [c for c in by_budget.values() if c["bytes"] is not None and not math.isnan(c[f"mean{lag}"])]
            x = [c["bytes"] for c in cells]
            m, s = np.array([c[f"mean{lag}"] for c in cells]), np.array([c[f"std{lag}"] for c in cells])
            line = ax.plot(x, m, ("--" if name in study["buffers"] else "-") + "o", ms=3, label=name)[0]
            ax.fill_between(x, m - s, m + s, color=line.get_color(), alpha=0.12)
        title, cross = f"lag {lag}", study["crossover"].get(lag)
        if lag in study["crossover"]:
            title += f" (crossover: {'none' if cross is None else f'{cross:,} B'})"
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context memory bytes held")
    axes[0].set_ylabel("live recall (mean ± std over seeds)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{', '.join(sorted(set(study['streams'].values())))}: buffers (dashed) vs fast-weight states")
    fig.tight_layout()
    fig.savefig(path)


def write_budget(suite_dir: Path, experiments: Sequence[Experiment], meta: dict[str, Any], out: Path) -> str:
    """Write ``budget.md``, ``budget.json`` (``{"cells": {learner: {B: cell}}, "buffers", "crossover": {L: B}}``,
    and ``"references"`` when logged) and ``budget.png`` (when lags are logged) under ``out`` when the suite is a
    budget study; the Markdown section for ``table.md`` (empty otherwise)."""
    if not meta.get("budgets"):
        return ""
    study = budget_study(suite_dir, experiments, meta)
    text = budget_markdown(study)
    (out / "budget.md").write_text(text)
    saved = {"cells": study["cells"], "buffers": study["buffers"], "crossover": study["crossover"]}
    saved |= {"references": study["references"]} if study["references"] else {}
    (out / "budget.json").write_text(json.dumps(saved, indent=1))
    if study["lags"]:
        budget_figure(study, out / "budget.png")
    return "## Budget study: live recall against context-memory bytes\n\n" + text
