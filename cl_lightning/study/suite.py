"""Suite files: experiment configs (with overlays) × seeds, expanded into the trials ``sweep`` runs.

A suite file names experiments (each a list of ``--config`` files: a complete config plus overlays, and optional
extra command-line arguments) and the seeds to run them with::

    seeds: [0, 1, 2]
    benchmark: pmnist            # key into cl_lightning/study/published.yaml (the paper's numbers)
    args: [--trainer.enable_progress_bar=false]   # for every trial
    experiments:
      bp:
        label: Backprop
        published: bp            # the paper's method key under `benchmark`
        configs: [configs/bp_pmnist.yaml, configs/quick.yaml]
        args: []
        paper_config: [configs/bp_pmnist.yaml]   # optional; default: the first of `configs`
        budget: 4096             # optional: the context-memory bytes the experiment is sized to (a budget study)
        kernel: knn_tuned        # optional: the experiment of the fixed kernel at this learner's support

An experiment with a ``grid`` is several: one per point of the product of its axes, each a list of values (a
mapping sets several fields at once); every ``{field}`` in its name, label, configs, arguments, budget and kernel
takes the point's values, so a learner × budget study is one entry::

      knn_fifo_{budget}:
        label: knn_fifo
        budget: "{budget}"
        configs: [configs/lifelong/budget/pmnist.yaml, configs/lifelong/budget/knn.yaml]
        args: [--model.init_args.memory_size={rows}, --model.init_args.support_size={rows}]
        grid:
          size: [{budget: 1024, rows: 4}, {budget: 4096, rows: 19}]

``report`` compares each trial with its ``paper_config`` (:mod:`cl_lightning.study.departures`); a ``budget``
makes the suite a budget study (:mod:`cl_lightning.study.report_budget`); a ``kernel`` pairs the learner with a
fixed kernel (:mod:`cl_lightning.study.report_pairs`). Each (experiment, seed) is a :class:`Trial`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from cl_lightning.errors import UsageError, did_you_mean, key_lines, load_yaml

SUITE_KEYS = ("name", "seeds", "benchmark", "args", "experiments")
EXPERIMENT_KEYS = ("configs", "args", "label", "published", "paper_config", "budget", "kernel", "grid")


def config_args(files: Sequence[str]) -> list[str]:
    """``--config F`` for each of ``files``."""
    return [a for f in files for a in ("--config", str(f))]


@dataclass(frozen=True)
class Trial:
    """One (experiment, seed) of a suite: the arguments of its ``fit``, and a fixed log folder
    ``<root>/<suite>/<experiment>/seed_<s>`` that a resumed trial writes into again.

    Args:
        suite: Suite name (the folder under the log root).
        name: Experiment name (the folder under the suite).
        seed: The seed of ``seed_everything`` (initialisation), the stream (permutations, splits, targets) and the
            learner (its own draws: support sets, admissions, CBP's redrawn units).
        configs: ``--config`` files, in order (a complete config, then overlays).
        args: Further command-line arguments of ``fit``.
    """

    suite: str
    name: str
    seed: int
    configs: tuple[str, ...]
    args: tuple[str, ...] = ()

    def log_dir(self, root: str | Path) -> Path:
        """``<root>/<suite>/<name>/seed_<seed>``: the TensorBoard folder of this trial."""
        return Path(root) / self.suite / self.name / f"seed_{self.seed}"

    def fit_args(self, root: str | Path, ckpt_path: str | Path | None = None) -> list[str]:
        """The arguments after ``python -m cl_lightning``: configs, then seeds and logger, then the trial's own."""
        args = ["fit", *config_args(self.configs)]
        s = str(self.seed)
        args += ["--seed_everything", s, "--data.stream.init_args.seed", s, "--model.init_args.seed", s]
        logger = {"save_dir": Path(root) / self.suite, "name": self.name, "version": f"seed_{self.seed}"}
        args += [a for key, value in logger.items() for a in (f"--trainer.logger.init_args.{key}", str(value))]
        resume = [] if ckpt_path is None else ["--ckpt_path", str(ckpt_path)]
        return [*args, *self.args, *resume]


@dataclass
class Suite:
    """A parsed suite file: its trials and what the report needs (labels, the paper's keys)."""

    name: str
    trials: list[Trial]
    benchmark: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    published: dict[str, str] = field(default_factory=dict)
    paper_configs: dict[str, list[str]] = field(default_factory=dict)
    budgets: dict[str, int] = field(default_factory=dict)
    kernels: dict[str, str] = field(default_factory=dict)

    def summary(self, source: str | Path) -> dict[str, Any]:
        """What the report reads from ``<suite folder>/suite.yaml``: experiments in order, labels, paper keys."""
        return {
            "source": str(source),
            "name": self.name,
            "benchmark": self.benchmark,
            "experiments": list(dict.fromkeys(t.name for t in self.trials)),
            "seeds": list(dict.fromkeys(t.seed for t in self.trials)),
            "labels": dict(self.labels),
            "published": dict(self.published),
            "paper_configs": {name: list(files) for name, files in self.paper_configs.items()},
            **({"budgets": dict(self.budgets)} if self.budgets else {}),
            **({"kernels": dict(self.kernels)} if self.kernels else {}),
        }


class _Where:
    """Names ``file:line`` of a key of a suite file in its messages."""

    def __init__(self, path: Path) -> None:
        self.path, self.lines = path, key_lines(path)

    def __call__(self, *keys: str) -> str:
        for n in range(len(keys), 0, -1):  # the key itself, else the nearest enclosing one
            if tuple(keys[:n]) in self.lines:
                return f"{self.path}:{self.lines[tuple(keys[:n])]}"
        return str(self.path)


def _resolve(path: str, where: str, suite_file: Path) -> str:
    """A config path as written (relative to the working directory), else relative to the suite file."""
    if Path(path).is_file():
        return path
    beside = suite_file.parent / path
    if beside.is_file():
        return str(beside)
    raise UsageError(f"{where}: config {path!r} not found (relative to {Path.cwd()} or {suite_file.parent})")


def _str_list(value: Any, where: str, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise UsageError(f"{where}: `{what}` must be a list of strings, got {value!r}")
    return [str(v) for v in value]


def _unknown(keys: Any, known: tuple[str, ...], where: _Where, *prefix: str) -> None:
    for key in keys:
        if key not in known:
            hint = did_you_mean(str(key), known)
            raise UsageError(f"{where(*prefix, str(key))}: unknown key '{key}'{hint}; the keys: {', '.join(known)}")


MAX_SEED = 2**32 - 1  # Lightning's seed_everything (numpy's range)


def check_seeds(seeds: list[int], where: str) -> None:
    """Refuse a seed Lightning's ``seed_everything`` would refuse in every trial (outside 0..2**32 - 1)."""
    if bad := [s for s in seeds if not 0 <= s <= MAX_SEED]:
        raise UsageError(f"{where}: seed {bad[0]} is out of range: seeds are 0..{MAX_SEED}")


def load_suite(path: str | Path) -> Suite:
    """Parse a suite file into its trials (experiments × seeds, experiments in file order).

    Raises:
        UsageError: On a file that does not parse, an unknown, missing or malformed key or a config that does not
            exist, naming the file and line.
    """
    path = Path(path)
    spec = load_yaml(path) or {}
    where = _Where(path)
    if not isinstance(spec, dict):
        raise UsageError(f"{path}: a suite is a mapping with keys {', '.join(SUITE_KEYS)}, got {type(spec).__name__}")
    _unknown(spec, SUITE_KEYS, where)
    seeds = spec.get("seeds")
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds):
        raise UsageError(f"{where('seeds')}: `seeds` must be a non-empty list of integers, got {seeds!r}")
    check_seeds(seeds, where("seeds"))
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"{where('seeds')}: `seeds` repeats a seed: {seeds}")
    experiments = spec.get("experiments")
    if not isinstance(experiments, dict) or not experiments:
        raise UsageError(f"{where('experiments')}: `experiments` must map names to {{configs: [...], args: [...]}}")
    name = str(spec.get("name") or path.stem)
    common = _str_list(spec.get("args"), where("args"), "args")
    suite = Suite(name=name, trials=[], benchmark=spec.get("benchmark"))
    for exp, entry in experiments.items():
        for name, point_entry in expand_grid(str(exp), entry, where("experiments", str(exp), "grid")):
            if name in suite.labels:
                raise UsageError(f"{where('experiments', str(exp))}: experiment {name!r} is named twice")
            _add_experiment(suite, name, point_entry, common, seeds, where, path)
    for exp, kernel in suite.kernels.items():
        if kernel not in suite.labels or kernel == exp:
            hint = did_you_mean(kernel, list(suite.labels))
            raise UsageError(
                f"{where('experiments', exp, 'kernel')}: `kernel` names another experiment of this suite, not "
                f"{kernel!r}{hint}"
            )
    return suite


def grid_points(grid: Any, where: str) -> list[dict[str, Any]]:
    """The points of a ``grid`` (axis -> list of values; a mapping value sets its keys, any other sets the axis), in
    the product's order (the first axis slowest)."""
    if not isinstance(grid, dict) or not grid or not all(isinstance(v, list) and v for v in grid.values()):
        raise UsageError(f"{where}: `grid` maps each axis to a non-empty list of values, got {grid!r}")
    axes = [[v if isinstance(v, dict) else {axis: v} for v in values] for axis, values in grid.items()]
    return [{k: v for part in combo for k, v in part.items()} for combo in product(*axes)]


def _fill(value: Any, point: dict[str, Any], where: str) -> Any:
    """``value`` with every ``{field}`` of its strings (lists: each item's) filled from ``point``."""
    if isinstance(value, list):
        return [_fill(v, point, where) for v in value]
    if not isinstance(value, str):
        return value
    try:
        return value.format_map(point)
    except (KeyError, IndexError, ValueError) as error:
        raise UsageError(f"{where}: {value!r} names a field the grid does not set ({error})") from None


def expand_grid(name: str, entry: Any, where: str) -> list[tuple[str, Any]]:
    """``[(name, entry)]`` for an experiment without a ``grid``, else one ``(name, entry)`` per grid point with its
    fields filled (:func:`_fill`; a ``budget`` written as a field is a number again)."""
    if not isinstance(entry, dict) or "grid" not in entry:
        return [(name, entry)]
    out = []
    for point in grid_points(entry["grid"], where):
        filled = {key: _fill(value, point, where) for key, value in entry.items() if key != "grid"}
        if isinstance(filled.get("budget"), str) and filled["budget"].isdigit():
            filled["budget"] = int(filled["budget"])
        out.append((_fill(name, point, where), filled))
    if len({n for n, _ in out}) < len(out):
        raise UsageError(f"{where}: the grid's points give {name!r} the same name twice: put its fields in the name")
    return out


def _add_experiment(
    suite: Suite, exp: str, entry: Any, common: list[str], seeds: list[int], where: _Where, path: Path
) -> None:
    """Check one experiment's entry and add its trials and report keys to ``suite``."""
    if isinstance(entry, dict):
        _unknown(entry, EXPERIMENT_KEYS, where, "experiments", exp)
    if not isinstance(entry, dict) or not entry.get("configs"):
        raise UsageError(
            f"{where('experiments', exp)}: experiment {exp!r} needs `configs: [experiment config, overlays...]`"
        )
    at = where("experiments", exp, "configs")
    configs = tuple(_resolve(c, at, path) for c in _str_list(entry["configs"], at, f"{exp}.configs"))
    args = tuple(common + _str_list(entry.get("args"), where("experiments", exp, "args"), f"{exp}.args"))
    paper = entry.get("paper_config") or list(configs[:1])
    paper = [paper] if isinstance(paper, str) else paper
    at = where("experiments", exp, "paper_config")
    suite.paper_configs[exp] = [_resolve(c, at, path) for c in _str_list(paper, at, f"{exp}.paper_config")]
    suite.labels[exp] = str(entry.get("label") or exp)
    if entry.get("published"):
        suite.published[exp] = str(entry["published"])
    if "budget" in entry:
        budget = entry["budget"]
        if type(budget) is not int or budget < 1:
            raise UsageError(f"{where('experiments', exp, 'budget')}: `budget` must be bytes (> 0), got {budget!r}")
        suite.budgets[exp] = budget
    if "kernel" in entry:
        suite.kernels[exp] = str(entry["kernel"])
    suite.trials += [Trial(suite.name, exp, seed, configs, args) for seed in seeds]
