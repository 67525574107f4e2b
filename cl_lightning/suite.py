"""Suite files: experiment configs (with overlays) × seeds, expanded into the trials ``sweep`` runs.

A suite file names experiments (each a list of ``--config`` files: a complete config plus overlays, and optional
extra command-line arguments) and the seeds to run them with::

    seeds: [0, 1, 2]
    benchmark: pmnist            # key into cl_lightning/published.yaml (the paper's numbers)
    args: [--trainer.enable_progress_bar=false]   # for every trial
    experiments:
      bp:
        label: Backprop
        published: bp            # the paper's method key under `benchmark`
        configs: [configs/bp_pmnist.yaml, configs/quick.yaml]
        args: []
        paper_config: [configs/bp_pmnist.yaml]   # optional; default: the first of `configs`

An experiment's **paper config** (``paper_config``: ``--config`` files, resolved as ``fit`` resolves them; by default
the experiment's first config) is what its trials are compared with: ``report`` lists every resolved value a trial
changes from it (its departures from the paper).

Every (experiment, seed) is one :class:`Trial`: the arguments of one ``python -m cl_lightning fit``, with the seed
given to ``seed_everything`` (initialisation), ``data.stream.init_args.seed`` (permutations, class pairs,
regression targets, splits) and ``model.init_args.seed`` (the learner's own draws: support sets, admissions,
CBP's redrawn units), and a fixed logger save_dir, name and version, ``<root>/<suite>/<experiment>/seed_<s>``, so
a resumed trial writes into the same folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Trial:
    """One (experiment, seed) of a suite: the arguments of its ``fit`` and where it logs.

    Args:
        suite: Suite name (the folder under the log root).
        name: Experiment name (the folder under the suite).
        seed: The seed given to ``seed_everything``, the stream and the learner.
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
        args = ["fit"]
        for config in self.configs:
            args += ["--config", config]
        s = str(self.seed)
        args += ["--seed_everything", s, "--data.stream.init_args.seed", s, "--model.init_args.seed", s]
        args += [
            "--trainer.logger.init_args.save_dir",
            str(Path(root) / self.suite),
            "--trainer.logger.init_args.name",
            self.name,
            "--trainer.logger.init_args.version",
            f"seed_{self.seed}",
        ]
        args += list(self.args)
        if ckpt_path is not None:
            args += ["--ckpt_path", str(ckpt_path)]
        return args


@dataclass
class Suite:
    """A parsed suite file: its trials and what the report needs (labels, the paper's keys)."""

    name: str
    trials: list[Trial]
    benchmark: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    published: dict[str, str] = field(default_factory=dict)
    paper_configs: dict[str, list[str]] = field(default_factory=dict)

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
        }


def _resolve(path: str, suite_file: Path) -> str:
    """A config path as written (relative to the working directory), else relative to the suite file."""
    if Path(path).exists():
        return path
    beside = suite_file.parent / path
    if beside.exists():
        return str(beside)
    raise FileNotFoundError(
        f"{suite_file}: config {path!r} not found (relative to {Path.cwd()} or {suite_file.parent})"
    )


def _str_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not all(isinstance(v, (str, int, float)) for v in value):
        raise ValueError(f"{what} must be a list of strings, got {value!r}")
    return [str(v) for v in value]


def load_suite(path: str | Path) -> Suite:
    """Parse a suite file into its trials (experiments × seeds, experiments in file order).

    Raises:
        ValueError: On a missing or malformed key, with the key named.
        FileNotFoundError: When a listed config does not exist.
    """
    path = Path(path)
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - {"name", "seeds", "benchmark", "args", "experiments"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)} (known: name, seeds, benchmark, args, experiments)")
    seeds = spec.get("seeds")
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"{path}: `seeds` must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{path}: `seeds` repeats a seed: {seeds}")
    experiments = spec.get("experiments")
    if not isinstance(experiments, dict) or not experiments:
        raise ValueError(f"{path}: `experiments` must map names to {{configs: [...], args: [...]}}")
    name = str(spec.get("name") or path.stem)
    common = _str_list(spec.get("args"), f"{path}: `args`")
    suite = Suite(name=name, trials=[], benchmark=spec.get("benchmark"))
    for exp, entry in experiments.items():
        if not isinstance(entry, dict) or not entry.get("configs"):
            raise ValueError(f"{path}: experiment {exp!r} needs `configs: [experiment config, overlays...]`")
        bad = set(entry) - {"configs", "args", "label", "published", "paper_config"}
        if bad:
            raise ValueError(f"{path}: experiment {exp!r} has unknown keys {sorted(bad)}")
        configs = tuple(_resolve(c, path) for c in _str_list(entry["configs"], f"{path}: {exp}.configs"))
        args = tuple(common + _str_list(entry.get("args"), f"{path}: {exp}.args"))
        paper = entry.get("paper_config") or configs[:1]
        paper = [paper] if isinstance(paper, str) else paper
        suite.paper_configs[str(exp)] = [_resolve(c, path) for c in _str_list(paper, f"{path}: {exp}.paper_config")]
        suite.labels[exp] = str(entry.get("label") or exp)
        if entry.get("published"):
            suite.published[exp] = str(entry["published"])
        suite.trials += [Trial(name, str(exp), seed, configs, args) for seed in seeds]
    return suite
