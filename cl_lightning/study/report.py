"""Read a suite's runs as the paper's figures and table: ``python -m cl_lightning report logs/<suite>``.

Reads every trial's TensorBoard events (``<suite>/<experiment>/seed_<s>/``), maps each logged value to its
evaluated task (:func:`per_task`), and writes ``<suite>/report/`` (or ``--out``): ``table.md`` / ``table.csv``
(:mod:`cl_lightning.study.report_tables`, beside ``published.yaml``), ``departures.md``
(:mod:`cl_lightning.study.departures`), the figures (:mod:`cl_lightning.study.report_figures`) and a budget study's
or a reuse study's tables (:mod:`cl_lightning.study.report_budget`, :mod:`cl_lightning.study.report_reuse`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from cl_lightning.contract import EvalSlot, metric_key, online_key
from cl_lightning.errors import OneLineParser, UsageError
from cl_lightning.study.report_budget import write_budget
from cl_lightning.study.report_pairs import write_pairs
from cl_lightning.study.report_reuse import write_reuse
from cl_lightning.study.report_tables import block_table, window_table, write_table
from cl_lightning.study.results import (
    FIGURE4_RANK,
    HESSIAN_RANK,
    Experiment,
    PaperWindows,
    figure4_rank,
    final_window,
    last_value,
    spread_of,
)


def read_scalars(log_dir: str | Path, tags: Sequence[str] | None = None) -> dict[str, dict[int, float]]:
    """Every scalar of the event files in ``log_dir`` as ``{tag: {step: value}}``; a step written twice (a resumed
    run redoing the steps after its checkpoint) keeps the later value (event files are read oldest first)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 1, "tensors": 1, "histograms": 1})
    acc.Reload()
    wanted = acc.Tags()["scalars"] if tags is None else [t for t in tags if t in acc.Tags()["scalars"]]
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in wanted}


def unreadable_events(log_dir: str | Path) -> list[str]:
    """The event files of ``log_dir`` that cannot be read whole, as ``name (why)``: empty, not TensorBoard's format,
    damaged (TensorBoard stops reading at a failed checksum) or truncated; or ``no event file`` in a trial folder."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    paths = sorted(Path(log_dir).glob("events.out.tfevents.*"))
    if not paths and any((Path(log_dir) / f).exists() for f in ("trial.json", "config.yaml")):
        return ["no event file"]
    bad = []
    for path in paths:
        if path.stat().st_size == 0:
            bad.append(f"{path.name} (empty)")
        elif next(iter(EventFileLoader(str(path)).Load()), None) is None:  # every valid file opens with a version
            bad.append(f"{path.name} (no readable event: corrupt or not an event file)")
        elif damage := _record_damage(path):
            bad.append(f"{path.name} ({damage}; the values after it are missing)")
    return bad


def _record_damage(path: Path) -> str | None:
    """Where an event file stops being readable (TFRecord framing: length, its CRC, data, its CRC), else ``None``."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    data, offset, records = path.read_bytes(), 0, 0
    while offset < len(data):
        header = data[offset : offset + 12]
        if len(header) < 12:
            return f"truncated at byte {offset} of {len(data)}, after {records} records"
        end = offset + 12 + int.from_bytes(header[:8], "little") + 4
        framed = int.from_bytes(header[8:], "little") == masked_crc32c(header[:8])  # the length can be trusted
        if framed and end > len(data):
            return f"truncated at byte {len(data)}, inside record {records + 1}"
        if not framed or int.from_bytes(data[end - 4 : end], "little") != masked_crc32c(data[offset + 12 : end - 4]):
            return f"damaged at byte {offset} of {len(data)} (record {records + 1} fails its checksum)"
        offset, records = end, records + 1
    return None


def per_task(
    scalars: dict[str, dict[int, float]], num_evaluated_tasks: int, warmup_tasks: int = 0
) -> dict[str, np.ndarray]:
    """``{tag: (num_evaluated_tasks,) array}``: each value at the evaluated task (Lightning's ``epoch`` scalar at
    the same step, minus ``warmup_tasks``) it was logged for, NaN where a tag was not logged (backward before task
    ``lag``, Hessian between measurements); values of warm-up epochs are dropped."""
    task_of = {step: int(v) - warmup_tasks for step, v in scalars.get("epoch", {}).items()}
    out = {}
    for tag, series in scalars.items():
        values = np.full(num_evaluated_tasks, np.nan)
        for step, v in series.items():
            task = task_of.get(step)
            if task is not None and 0 <= task < num_evaluated_tasks:
                values[task] = v
        out[tag] = values
    return out


def stream_tasks(config: dict[str, Any]) -> tuple[int | None, int]:
    """``(num_tasks, warmup_tasks)`` of a run's saved config, read off its stream (``trainer.max_epochs`` is filled
    in from it); ``num_tasks`` is None where the config does not say."""
    stream = ((config.get("data") or {}).get("stream") or {}).get("init_args") or {}
    tasks = stream.get("num_tasks")
    return (int(tasks) if tasks is not None else None), int(stream.get("warmup_tasks") or 0)


def _is_run(d: Path) -> bool:
    """Whether ``d`` is a run's log folder (events, a sweep's ``trial.json`` or a saved config in it)."""
    return d.is_dir() and any(
        next(d.glob(name), None) for name in ("events.out.tfevents.*", "trial.json", "config.yaml")
    )


def _run_seed(d: Path, index: int) -> int:
    """A fit's seed as its saved config has it (``seed_everything``), else ``index``."""
    config = d / "config.yaml"
    seed = (yaml.safe_load(config.read_text()) or {}).get("seed_everything") if config.exists() else None
    return int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else index


def single_runs(folder: Path) -> dict[str, list[tuple[int, Path]]]:
    """A fit's log folder (``logs/<name>/version_N``) or the folder of several fits of one config (``logs/<name>``),
    as one experiment named ``<name>`` whose seeds are the runs (their ``seed_everything``; repeated or missing
    seeds: the runs' order). Empty when ``folder`` is neither."""
    if _is_run(folder):
        return {folder.parent.name: [(_run_seed(folder, 0), folder)]}
    runs = [d for d in sorted(folder.glob("version_*")) if _is_run(d)]
    seeds = [_run_seed(d, i) for i, d in enumerate(runs)]
    if len(set(seeds)) < len(seeds):
        seeds = list(range(len(runs)))
    return {folder.name: list(zip(seeds, runs, strict=True))} if runs else {}


def _trial_dirs(suite_dir: Path, order: Sequence[str]) -> dict[str, list[tuple[int, Path]]]:
    """A sweep's ``<experiment>/seed_<s>`` folders by experiment (``order`` first), else :func:`single_runs`."""
    found: dict[str, list[tuple[int, Path]]] = {}
    for d in sorted(suite_dir.glob("*/seed_*")):
        if _is_run(d):
            found.setdefault(d.parent.name, []).append((int(d.name.removeprefix("seed_")), d))
    if not found:
        return single_runs(suite_dir)
    ranked = {name: i for i, name in enumerate(order)}
    return dict(sorted(found.items(), key=lambda kv: (ranked.get(kv[0], len(ranked)), kv[0])))


def load_suite_runs(suite_dir: str | Path) -> tuple[list[Experiment], dict[str, Any]]:
    """Every trial with events in ``suite_dir``, by experiment (``suite.yaml``'s order, else alphabetical) and seed."""
    suite_dir = Path(suite_dir)
    meta_path = suite_dir / "suite.yaml"
    meta = yaml.safe_load(meta_path.read_text()) if meta_path.exists() else {}
    experiments = []
    for name, trials in _trial_dirs(suite_dir, meta.get("experiments") or []).items():
        exp = None
        for seed, d in sorted(trials):
            config = yaml.safe_load((d / "config.yaml").read_text()) if (d / "config.yaml").exists() else {}
            scalars = read_scalars(d)
            logged = max(scalars.get("epoch", {0: 0}).values()) + 1
            tasks, warmup = stream_tasks(config)
            evaluated = (tasks or logged) - warmup
            if exp is None:
                logged_acc = metric_key(EvalSlot("forward"), "acc") in scalars or online_key("acc") in scalars
                metric = "acc" if logged_acc else "mse"
                stream = str(config.get("data", {}).get("stream", {}).get("class_path", "")).rsplit(".", 1)[-1]
                label = (meta.get("labels") or {}).get(name, name)
                published = (meta.get("published") or {}).get(name)
                exp = Experiment(
                    name, label, evaluated, metric, stream=stream or None, published=published, warmup_tasks=warmup
                )
                exp.backward_lag = config.get("data", {}).get("backward_lag")
            record = json.loads((d / "trial.json").read_text()) if (d / "trial.json").exists() else {}
            exp.add(seed, per_task(scalars, exp.num_evaluated_tasks, warmup), record)
        experiments.append(exp)
    return experiments, meta


def published_numbers() -> dict[str, Any]:
    """The paper's numbers (``cl_lightning/study/published.yaml``)."""
    return yaml.safe_load(resources.files("cl_lightning.study").joinpath("published.yaml").read_text())


def paper_entry(exp: Experiment, meta: dict[str, Any], paper: dict[str, Any]) -> dict[str, Any]:
    """The paper's numbers for this experiment: benchmark from the suite (or the stream class), method from the
    suite's ``published`` key (or the experiment's name when it is a method key)."""
    return _benchmark(exp, meta, paper).get("methods", {}).get(exp.published or exp.name, {})


def _benchmark(exp: Experiment, meta: dict[str, Any], paper: dict[str, Any]) -> dict[str, Any]:
    """The paper's benchmark: the suite's, else the one whose stream the experiment ran (empty: none)."""
    key = meta.get("benchmark") or next((k for k, b in paper["benchmarks"].items() if b["stream"] == exp.stream), None)
    return paper["benchmarks"].get(key, {})


def paper_points(experiments: Sequence[Experiment], meta: dict[str, Any]) -> dict[str, PaperWindows]:
    """Per experiment with a paper curve (``published.yaml``'s ``windows``), the paper's windows and chance level."""
    paper, out = published_numbers(), {}
    for exp in experiments:
        spec = _benchmark(exp, meta, paper)
        entry = paper_entry(exp, meta, paper)
        windows = entry.get("windows")
        if windows is not None:
            scores = {role: windows[role] for role in ("forward", "backward") if role in windows}
            rank, figures = entry.get("effective_rank") or {}, {}
            if "windows" in rank:  # Figure 4's normalised rank at the same windows
                scores["effective_rank"], figures["effective_rank"] = rank["windows"], str(rank["figure"])
            fill = int(spec.get("rank_zero_fill", 0))
            out[exp.name] = PaperWindows(spec["window"], windows["at"], scores, str(windows["figure"]), figures, fill)
    return out


def add_figure4_rank(experiments: Sequence[Experiment], paper: dict[str, PaperWindows]) -> None:
    """Give each experiment with measured ranks and a paper Figure 4 curve its :data:`FIGURE4_RANK` rows: the rank
    as the authors' scripts draw it (:func:`~cl_lightning.study.results.figure4_rank`)."""
    for exp in experiments:
        windows = paper.get(exp.name)
        rows = exp.rows(HESSIAN_RANK)
        if windows is not None and "effective_rank" in windows.scores and not np.isnan(rows).all():
            exp.curves[FIGURE4_RANK] = list(figure4_rank(rows, windows.rank_zero_fill))


def chance_level(experiments: Sequence[Experiment], meta: dict[str, Any]) -> float | None:
    """The benchmark's chance score (``published.yaml``'s ``chance``; ``None`` for regression or an unknown one)."""
    paper = published_numbers()
    levels = {_benchmark(e, meta, paper).get("chance") for e in experiments}
    return levels.pop() if len(levels) == 1 else None


def paper_text(entry: dict[str, Any] | None) -> str:
    """The paper's value at the end of its run, ``0.865 (Fig. 1a, p. 8)`` or ``0.78–0.80 (…)``; empty if it has none."""
    if not entry or "end" not in entry:
        return ""
    v = entry["end"]
    value = f"{v[0]:.3g}–{v[1]:.3g}" if isinstance(v, list) else f"{v:.3g}"
    return f"{value} (Fig. {entry['figure']}, p. {entry['page']})"


def paper_seconds(entry: dict[str, Any] | None) -> str:
    """The appendix table's wall clock as seconds per task, e.g. ``3.1 (Tab. 1, p. 13)``."""
    if not entry:
        return ""
    return f"{entry['hours'] * 3600 / entry['tasks']:.3g} (Tab. {entry['table']}, p. {entry['page']})"


def table_rows(experiments: Sequence[Experiment], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per experiment: the numbers of ``table.csv`` (means, stds, the paper's values as text)."""
    paper, rows = published_numbers(), []
    for exp in experiments:
        entry, m = paper_entry(exp, meta, paper), exp.metric
        final = max(exp.window, min(exp.num_evaluated_tasks, 5))
        row: dict[str, Any] = {"experiment": exp.name, "label": exp.label, "seeds": len(exp.seeds)}
        done = ~np.isnan(exp.rows("epoch")[:, -1])  # seeds whose events reach the last task
        row |= {"unfinished": int((~done).sum()), "tasks": exp.num_evaluated_tasks, "final_window": final}
        scores = {"forward": exp.score("forward"), "backward": exp.score("backward"), "online": exp.rows(online_key(m))}
        for key, values in scores.items():
            mean, std, n = final_window(values, final)
            row |= {f"{key}_mean": mean, f"{key}_std": spread_of(std, n), f"{key}_paper": paper_text(entry.get(key))}
            if key == "forward":
                row["final_seeds"] = n  # the seeds whose runs reached the final window: the finished ones
        for what in ("avg", "bwt", "fwt", "forgetting"):
            mean, std, n = last_value(exp.rows(f"forgetting/{what}")[done])  # R of finished runs only
            row |= {f"{what}_mean": mean, f"{what}_std": spread_of(std, n)}
        walls = [sum(a["wall_seconds"] for a in r["attempts"]) for r in exp.records if r.get("status") == "finished"]
        peaks = [max(a["peak_rss_bytes"] or 0 for a in r["attempts"]) for r in exp.records if r.get("attempts")]
        train = exp.rows("cost/task_seconds")
        stream_tasks = exp.num_evaluated_tasks + exp.warmup_tasks  # a warm-up task costs its training time too
        row["seconds_per_task"] = float(np.mean(walls)) / stream_tasks if walls else math.nan
        row["train_seconds_per_task"] = float(np.nanmean(train)) if not np.isnan(train).all() else math.nan
        row["seconds_per_task_paper"] = paper_seconds(entry.get("wall_clock"))
        row["peak_rss_gib"] = float(np.mean(peaks)) / 2**30 if peaks else math.nan
        row["metric"] = m
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m cl_lightning report``."""
    from cl_lightning.study.departures import write_departures
    from cl_lightning.study.report_figures import write_figures  # matplotlib only when drawing, not in the sweep

    p = OneLineParser(prog="python -m cl_lightning report", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "suite_dir",
        help="a suite's log folder (e.g. runs/pmnist_paper_full_cpu), a fit's (logs/<name>/version_N) or the folder of "
        "several fits of one config (logs/<name>: one experiment, its runs as seeds)",
    )
    p.add_argument("--out", help="where to write the report (default: <suite_dir>/report)")
    p.add_argument(
        "--block",
        type=int,
        default=100,
        help="tasks per block of table.md's per-block table, for runs without the paper's windows (0: no table)",
    )
    p.add_argument(
        "--pairs",
        help="also write the suite's learned-against-fixed pairs into this CSV, which gathers several suites "
        "(e.g. docs/results/learned_vs_fixed/pairs.csv; the suite's earlier rows there are replaced)",
    )
    opts = p.parse_args(argv)
    if opts.block < 0:
        p.error(f"--block must be 0 (no per-block table) or a number of tasks, not {opts.block}")
    suite_dir = Path(opts.suite_dir)
    experiments, meta = load_suite_runs(suite_dir)
    if not experiments:
        raise UsageError(
            f"{suite_dir}: no runs with event files (expected a sweep's <experiment>/seed_<s>/, a fit's "
            "logs/<name>/version_N/ or the logs/<name>/ holding such folders)"
        )
    damaged: dict[str, list[str]] = {}
    for trial in sorted(suite_dir.glob("*/seed_*")):
        if bad := unreadable_events(trial):
            print(f"could not read {trial} (its values are missing below): {', '.join(bad)}", flush=True)
            damaged.setdefault(trial.parent.name, []).append(trial.name)
    out = Path(opts.out) if opts.out else suite_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    rows = table_rows(experiments, meta)
    write_departures(rows, suite_dir, meta, out)  # departures.md names experiments by their plain label
    for row in rows:  # its numbers come from what could be read: marked partial
        if row["experiment"] in damaged:
            row["label"] += f" (partial: {', '.join(damaged[row['experiment']])} damaged)"
    paper = paper_points(experiments, meta)
    add_figure4_rank(experiments, paper)
    window = window_table(experiments, paper, out)
    budget = write_budget(suite_dir, experiments, meta, out)
    reuse = write_reuse(experiments, out)
    pairs = write_pairs(experiments, meta, suite_dir, out, Path(opts.pairs) if opts.pairs else None)
    sections = (window, block_table(experiments, paper, opts.block), budget, reuse, pairs)
    text = write_table(rows, out) + "".join("\n" + t for t in sections if t)
    (out / "table.md").write_text(text)
    windows = ["windows.csv"] if window else []
    windows += [f for f in ("budget.md", "budget.json", "budget.png") if budget and (out / f).exists()]
    windows += ["reuse.md", "reuse.json"] if reuse else []
    windows += ["pairs.csv"] if pairs else []
    figures = write_figures(experiments, out, paper, chance_level(experiments, meta))
    print(text)
    print("wrote " + ", ".join(str(out / f) for f in ["table.md", "table.csv", *windows, "departures.md", *figures]))
    return 0
