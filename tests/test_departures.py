"""Departures from the paper: resolved trial configs against their experiment's resolved paper config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import CONFIGS, ROOT

from cl_lightning.errors import UsageError
from cl_lightning.run.resolve import resolved_config
from cl_lightning.study.departures import (
    Departure,
    config_args,
    departures,
    departures_text,
    flatten,
    resolved_configs,
    suite_departures,
)
from cl_lightning.study.report import main as report_main
from cl_lightning.study.suite import load_suite


def test_departures_skip_bookkeeping_and_list_each_value_once() -> None:
    paper = {
        "seed_everything": 0,
        "model": {"class_path": "A", "init_args": {"lr": 0.1, "seed": 0, "sizes": [2, 2]}},
        "trainer": {"max_epochs": 10, "logger": {"init_args": {"name": "a", "version": None}}},
    }
    trials = [
        {
            "seed_everything": seed,
            "model": {"class_path": "A", "init_args": {"lr": lr, "seed": seed, "sizes": [2, 2]}},
            "trainer": {"max_epochs": 5, "logger": {"init_args": {"name": "b", "version": f"seed_{seed}"}}},
            "ckpt_path": None,
        }
        for seed, lr in ((0, 0.01), (1, 0.02), (2, 0.01))
    ]
    assert flatten(trials[0])["model.sizes"] == [2, 2]
    assert departures(paper, trials) == [Departure("model.lr", 0.1, (0.01, 0.02))]
    assert departures_text(departures(paper, trials)) == "model.lr 0.1 → 0.01 / 0.02"
    assert departures_text(departures(paper, [paper])) == "none"
    # a key the paper config lacks (here: a list the trial adds) is listed against null
    assert str(departures({}, [{"data": {"backward_lag": [1, 2]}}])[0]) == "data.backward_lag null → [1, 2]"
    # a key a trial's config does not hold (an option added after it ran) is not compared for that trial
    newer = {"data": {"steps_per_batch": 1, "eval_queries": 2000}}
    older = {"data": {"eval_queries": 200}}
    assert departures(newer, [older]) == [Departure("data.eval_queries", 2000, (200,))]
    assert departures(newer, [older, {"data": {"steps_per_batch": 100, "eval_queries": 2000}}]) == [
        Departure("data.eval_queries", 2000, (200, 2000)),
        Departure("data.steps_per_batch", 1, (100,)),
    ]


def _suite_folder(tmp_path: Path, spec: dict) -> Path:
    """A suite file and the folder a sweep of it leaves: ``suite.yaml`` and each trial's resolved ``config.yaml``
    (what ``fit`` saves), no events needed."""
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(spec))
    suite = load_suite(path)
    logs = tmp_path / "logs"
    (logs / suite.name).mkdir(parents=True)
    (logs / suite.name / "suite.yaml").write_text(yaml.safe_dump(suite.summary(path)))
    for trial in suite.trials:
        trial.log_dir(logs).mkdir(parents=True)
        config = resolved_config([], trial.fit_args(logs)[1:])
        (trial.log_dir(logs) / "config.yaml").write_text(yaml.safe_dump(config))
    return logs / suite.name


def test_step_kernels_with_the_same_numbers_are_no_departure() -> None:
    """``torch`` (the name before step engines), ``autograd`` and ``fused`` compute the same numbers: none departs
    from another; ``native`` rounds otherwise and does."""
    paper = {"model": {"init_args": {"step_kernel": "autograd"}}}
    same = [{"model": {"init_args": {"step_kernel": k}}} for k in ("torch", "fused", "autograd")]
    assert departures(paper, same) == []
    native = {"model": {"init_args": {"step_kernel": "native"}}}
    assert departures_text(departures(paper, [native])) == "model.step_kernel autograd → native"


def test_a_suite_lists_what_its_trials_change_from_the_paper_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    bp, quick, warmup = (str(CONFIGS / n) for n in ("bp_pmnist.yaml", "quick.yaml", "paper/pmnist_warmup.yaml"))
    spec = {
        "seeds": [0, 1],
        "args": ["--trainer.enable_progress_bar=false", "--data.stream.init_args.warmup_tasks=5"],
        "experiments": {
            "quick": {"configs": [bp, quick]},  # paper config: bp_pmnist.yaml alone
            "lr": {
                "configs": [bp],
                "paper_config": [bp, warmup],
                "args": ["--model.init_args.optimizer.init_args.lr=0.001", "--data.stream.init_args.num_tasks=105"],
            },
        },
    }
    found = suite_departures(_suite_folder(tmp_path, spec), ["quick", "lr"], {})
    assert found == {"quick": "paper config unknown", "lr": "paper config unknown"}  # no suite.yaml given
    suite_dir = tmp_path / "logs" / "toy"
    meta = yaml.safe_load((suite_dir / "suite.yaml").read_text())
    found = suite_departures(suite_dir, ["quick", "lr"], meta)
    assert departures_text(found["quick"]) == (
        "data.eval_queries 2000 → 200; data.num_probe_tasks 10 → 5; data.stream.chunk_size 400 → 100; "
        "data.stream.num_tasks 7500 → 30; data.stream.query_size 2000 → 500; data.stream.train_size 58000 → 10000; "
        "data.stream.warmup_tasks 0 → 5"
    )
    # the paper's warm-up is in its paper config: only the learning rate and the length differ
    assert departures_text(found["lr"]) == "data.stream.num_tasks 7505 → 105; model.optimizer.lr 0.0001 → 0.001"

    out = tmp_path / "report"
    (suite_dir / "lr" / "seed_0" / "events.out.tfevents.0.host").write_bytes(b"")  # report needs an event file
    report_main([str(suite_dir), "--out", str(out)])
    table = (out / "table.md").read_text()
    assert table.splitlines()[2] == (  # seed_0's event file is empty, seed_1 has none: both named as damaged
        "| lr (partial: seed_0, seed_1 damaged) | 2 (2 unfinished) | 100 | — |  | — |  | — | — | — | — | — | — |  | — "
        "| data.stream.num_tasks 7505 → 105; model.optimizer.lr 0.0001 → 0.001 |"
    )
    assert (out / "departures.md").read_text().split("## lr (`lr`)\n\n")[1].split("\n## ")[0] == (
        f"Paper config: `{bp}`, `{warmup}`.\n\n"
        "| key | paper config | runs |\n|---|---|---|\n"
        "| `data.stream.num_tasks` | 7505 | 105 |\n"
        "| `model.optimizer.lr` | 0.0001 | 0.001 |\n"
    )


def test_the_paper_suite_departs_only_in_length_and_scored_queries(monkeypatch: pytest.MonkeyPatch) -> None:
    """configs/suites/pmnist_paper_cpu.yaml: every experiment, resolved as its trial runs, differs from its paper
    config (paper-size config + the authors' 5 warm-up tasks) in the number of tasks and of scored queries only."""
    monkeypatch.chdir(ROOT)
    suite = load_suite(CONFIGS / "suites" / "pmnist_paper_cpu.yaml")
    lengths = {}
    for trial in suite.trials:
        if trial.seed != 0:
            continue
        ours = resolved_config([], trial.fit_args("logs")[1:])
        found = departures(resolved_config(suite.paper_configs[trial.name]), [ours])
        assert [d.key for d in found] == ["data.eval_queries", "data.stream.num_tasks"], trial.name
        assert (found[0].paper, found[0].ours, found[1].paper) == (2000, (200,), 7505)
        lengths[trial.name] = found[1].ours[0]
    assert lengths == {"qoa_v1": 1005, "knn": 1005, "knn_200": 1005, "bp": 505, "cbp": 505, "qoa_v2": 1005,
                       "full_attention": 1005}  # fmt: skip


@pytest.mark.slow  # resolves 13 configs through the CLI: ~75 s on one core
@pytest.mark.parametrize(
    ("suite_name", "expected"),
    [
        ("scr_paper", {}),
        (
            "pmnist_paper",
            {"trainer.precision": (None, "bf16-mixed")},
        ),
    ],
)
def test_the_paper_size_suites_run_the_warmup_and_depart_only_where_declared(
    monkeypatch: pytest.MonkeyPatch, suite_name: str, expected: dict[str, tuple[object, object]]
) -> None:
    """The paper-size suites run the authors' 5 warm-up tasks (their paper config is their own config list): the
    SCR suite departs only in the C step kernel its Backprop, CBP and QOA declare (float32 rounding apart from the
    torch path's), the Permuted-MNIST one in the GPU's precision only (and MAML in its 75 tasks)."""
    monkeypatch.chdir(ROOT)
    suite = load_suite(CONFIGS / "suites" / f"{suite_name}.yaml")
    for trial in suite.trials:
        if trial.seed != suite.trials[0].seed:
            continue
        ours = resolved_config([], trial.fit_args("logs")[1:])
        assert ours["data"]["stream"]["init_args"]["warmup_tasks"] == 5, trial.name
        found = {
            d.key: (d.paper, d.ours[0]) for d in departures(resolved_config(suite.paper_configs[trial.name]), [ours])
        }
        want = dict(expected)
        if "--model.init_args.step_kernel=native" in trial.args:  # declared in the suite: listed as a departure
            want["model.step_kernel"] = (found.get("model.step_kernel", ("?",))[0], "native")
        if trial.name == "maml" and suite_name == "pmnist_paper":
            want["data.stream.num_tasks"] = (7505, 80)
        assert found == want, trial.name


def test_the_report_resolves_paper_configs_in_a_child_process_as_fit_does() -> None:
    """``report`` resolves paper configs in a child process (it imports no training code): the same values as
    resolving them here, and a config that does not parse is one ``UsageError``."""
    files = [str(CONFIGS / "bp_pmnist.yaml"), str(CONFIGS / "paper" / "pmnist_warmup.yaml")]
    assert resolved_configs([config_args(files)]) == [resolved_config(files)]
    with pytest.raises(UsageError, match="no_such_option"):
        resolved_configs([[*config_args(files[:1]), "--model.init_args.no_such_option=1"]])
