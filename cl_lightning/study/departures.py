"""Departures from the paper: every resolved value a suite's trials change from the paper config of their experiment.

An experiment's paper config (the suite's ``paper_config``, recorded in ``<suite>/suite.yaml``) is resolved as
``fit`` resolves it (:func:`resolved_configs`) and compared value by value with each trial's saved ``config.yaml``,
so what is listed is what the runs did differently; :data:`IGNORED` and every ``seed`` are left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cl_lightning.contract import step_numbers
from cl_lightning.errors import UsageError
from cl_lightning.study.childproc import package_pythonpath
from cl_lightning.study.report_tables import markdown_table
from cl_lightning.study.suite import config_args, load_suite

IGNORED = frozenset({"seed_everything", "trainer.logger.save_dir", "trainer.logger.name", "trainer.logger.version",
                     "trainer.enable_progress_bar", "trainer.accelerator", "trainer.devices", "trainer.max_epochs",
                     "ckpt_path", "weights_only"})  # fmt: skip
"""Keys (``init_args`` left out) that say where and how a trial ran, not what it ran: ``trainer.accelerator`` is the
hardware (what it computes in, ``trainer.precision``, is compared), ``trainer.max_epochs`` is filled in from
``data.stream.num_tasks`` (which is compared)."""


@dataclass(frozen=True)
class Departure:
    """One key whose value in the runs differs from the paper config's.

    Args:
        key: Dotted config key without ``init_args`` (``data.stream.num_tasks``), as the command line takes it.
        paper: The paper config's value (``None`` where it has no such key).
        ours: The trials' values, each once, in seed order.
    """

    key: str
    paper: Any
    ours: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.key} {show(self.paper)} → {' / '.join(show(v) for v in self.ours)}"


def show(value: Any) -> str:
    """A config value as YAML writes it inline: ``null``, ``false``, ``[1, 2]``, ``0.0001``."""
    return value if isinstance(value, str) else json.dumps(value)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of a nested config, ``init_args`` levels dropped; lists and empty dicts are values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = prefix if key == "init_args" else f"{prefix}{key}."
        if isinstance(value, dict) and value:
            out |= flatten(value, name)
        else:
            out[name.rstrip(".")] = value
    return out


def departures(paper: dict[str, Any], trials: Sequence[dict[str, Any]]) -> list[Departure]:
    """The keys where any trial's resolved config differs from the paper config's, sorted by key (a key a trial's
    config does not hold, an option added since it ran, is not compared for that trial)."""
    base, runs = flatten(paper), [flatten(t) for t in trials]
    found = []
    for key in sorted(set(base).union(*runs)):
        if key in IGNORED or key.rsplit(".", 1)[-1] == "seed":
            continue
        ours = [run[key] for run in runs if key in run]
        same = step_numbers if key.endswith(".step_kernel") else lambda v: v  # engines with the same numbers
        if any(same(v) != same(base.get(key)) for v in ours):
            distinct = tuple(v for i, v in enumerate(ours) if v not in ours[:i])
            found.append(Departure(key, base.get(key), distinct))
    return found


def paper_configs(meta: dict[str, Any]) -> dict[str, list[str]]:
    """Each experiment's paper config files: ``suite.yaml``'s record, else the suite file it names, if present."""
    if meta.get("paper_configs"):
        return {name: list(files) for name, files in meta["paper_configs"].items()}
    source = meta.get("source")
    if source and Path(source).is_file():
        return load_suite(source).paper_configs
    return {}


def resolved_configs(argvs: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """The configs that ``fit ARGV`` resolves to for each of ``argvs``, as plain values, resolved in one child process
    (:mod:`cl_lightning.run.resolve`: the report imports no training code).

    Raises:
        UsageError: A config does not parse (the command line's one-line ``error:``).
    """
    if not argvs:
        return []
    done = subprocess.run(
        [sys.executable, "-m", "cl_lightning.run.resolve", "-"],
        input=json.dumps([list(a) for a in argvs]),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": package_pythonpath()},
        check=False,
    )
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise UsageError(lines[-1].removeprefix("error: ") if lines else "the paper configs could not be resolved")
    return json.loads(done.stdout)


def suite_departures(
    suite_dir: Path, experiments: Sequence[str], meta: dict[str, Any]
) -> dict[str, str | list[Departure]]:
    """Per experiment its departures, or why there are none to list (paper config unknown or missing)."""
    papers, out, known = paper_configs(meta), {}, {}
    for name in experiments:
        files = papers.get(name)
        missing = [f for f in files or [] if not Path(f).is_file()]
        if not files or missing:
            out[name] = f"paper config {'unknown' if not files else 'not found: ' + ', '.join(missing)}"
        else:
            known[name] = files
    for name, paper in zip(known, resolved_configs([config_args(f) for f in known.values()]), strict=True):
        trials = [yaml.safe_load(p.read_text()) for p in sorted((suite_dir / name).glob("seed_*/config.yaml"))]
        out[name] = departures(paper, trials)
    return {name: out[name] for name in experiments}


def departures_text(found: str | list[Departure]) -> str:
    """One table cell: ``key paper → ours; …``, ``none`` or why it is unknown."""
    return found if isinstance(found, str) else "; ".join(str(d) for d in found) or "none"


def write_departures(rows: Sequence[dict[str, Any]], suite_dir: Path, meta: dict[str, Any], out: Path) -> None:
    """Fill each of ``table.md``'s rows' ``departures`` (:func:`departures_text`) and write ``departures.md``: per
    experiment its paper config and a table of the keys its runs change."""
    found = suite_departures(suite_dir, [r["experiment"] for r in rows], meta)
    papers, labels = paper_configs(meta), {r["experiment"]: r["label"] for r in rows}
    lines = [
        "# Departures from the paper config",
        "",
        "Every resolved config value in which this suite's trials (their saved `config.yaml`) differ from the paper "
        "config of their experiment, resolved as `fit` resolves it from the current checkout. Not compared: "
        f"{', '.join(f'`{k}`' for k in sorted(IGNORED))} and every `seed` (where and how a trial ran, not what it "
        "ran), nor a key a trial's config does not hold (an option added after it ran). Keys are written without "
        "`init_args`, as the command line takes them.",
    ]
    for name, deps in found.items():
        files = ", ".join(f"`{f}`" for f in papers.get(name, [])) or "unknown"
        lines += ["", f"## {labels.get(name, name)} (`{name}`)", "", f"Paper config: {files}.", ""]
        if isinstance(deps, str) or not deps:
            lines.append(f"Departures: {departures_text(deps)}.")
            continue
        keys = [[f"`{d.key}`", show(d.paper), " / ".join(show(v) for v in d.ours)] for d in deps]
        lines += markdown_table(("key", "paper config", "runs"), keys)
    (out / "departures.md").write_text("\n".join(lines) + "\n")
    for row in rows:
        row["departures"] = departures_text(found[row["experiment"]])
