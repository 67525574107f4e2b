"""Suites: expansion into trials, the seed reaching every RNG, sequential and Ray runs, skip and resume."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import CONFIGS, ROOT

from cl_lightning.errors import UsageError
from cl_lightning.run.cli import main as cli_main
from cl_lightning.study import sweep
from cl_lightning.study.report import main as report_main
from cl_lightning.study.report import per_task, published_numbers, read_scalars
from cl_lightning.study.suite import Trial, load_suite
from cl_lightning.study.sweep import main as sweep_main
from cl_lightning.study.sweep import run_sequential
from cl_lightning.study.trial_run import FINISHED, resume_point, trial_state

SUITES = sorted((CONFIGS / "suites").glob("*.yaml"))

# a complete experiment config on the synthetic stream: a trial takes a few seconds, most of it process start
TINY = {
    "seed_everything": 0,
    "trainer": {
        "accelerator": "cpu",
        "devices": 1,
        "reload_dataloaders_every_n_epochs": 1,
        "num_sanity_val_steps": 0,
        "deterministic": True,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {"save_dir": "logs", "name": "tiny", "default_hp_metric": False},
        },
        "callbacks": [
            {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
            {"class_path": "cl_lightning.callbacks.ForgettingMonitor", "init_args": {"plot": False}},
            {"class_path": "cl_lightning.callbacks.CostMonitor"},
        ],
    },
    "model": {
        "class_path": "cl_lightning.learners.Backprop",
        "init_args": {"hidden_sizes": [32], "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.01}}},
    },
    "data": {
        "stream": {
            "class_path": "cl_lightning.data.SyntheticClasses",
            "init_args": {"num_tasks": 4, "permute_inputs": True, "train_size": 128, "query_size": 32},
        },
        "context_size": 32,
        "backward_lag": 1,
        "num_probe_tasks": 2,
    },
}


def _suite(tmp_path: Path, seeds: list[int], tasks: int = 4, experiments: tuple[str, ...] = ("a", "b")) -> Path:
    config = tmp_path / "tiny.yaml"
    spec = json.loads(json.dumps(TINY))
    spec["data"]["stream"]["init_args"]["num_tasks"] = tasks
    config.write_text(yaml.safe_dump(spec))
    overlay = tmp_path / "wide.yaml"
    overlay.write_text(yaml.safe_dump({"model": {"init_args": {"hidden_sizes": [48]}}}))
    suite = tmp_path / "toy.yaml"
    exps = {name: {"configs": [str(config), str(overlay)] if name == "b" else [str(config)]} for name in experiments}
    suite.write_text(yaml.safe_dump({"seeds": seeds, "experiments": exps}))
    return suite


def test_suite_expands_to_experiments_times_seeds(tmp_path: Path) -> None:
    suite = load_suite(_suite(tmp_path, [3, 7]))
    assert [(t.name, t.seed) for t in suite.trials] == [("a", 3), ("a", 7), ("b", 3), ("b", 7)]
    trial = suite.trials[3]
    assert trial.log_dir(tmp_path / "logs") == tmp_path / "logs" / "toy" / "b" / "seed_7"
    args = trial.fit_args(tmp_path / "logs", ckpt_path="x.ckpt")
    assert args[:5] == ["fit", "--config", str(tmp_path / "tiny.yaml"), "--config", str(tmp_path / "wide.yaml")]
    pairs = dict(zip(args[5::2], args[6::2], strict=False))
    for key in ("--seed_everything", "--data.stream.init_args.seed", "--model.init_args.seed"):
        assert pairs[key] == "7"
    assert pairs["--trainer.logger.init_args.save_dir"] == str(tmp_path / "logs" / "toy")
    assert (pairs["--trainer.logger.init_args.name"], pairs["--trainer.logger.init_args.version"]) == ("b", "seed_7")
    assert args[-2:] == ["--ckpt_path", "x.ckpt"]


def test_an_experiment_named_by_a_number_keeps_its_label_and_paper_key(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    exps = {1: {"configs": [str(config)], "label": "One", "published": "qoa_v1"}}
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump({"seeds": [0], "experiments": exps}))
    suite = load_suite(tmp_path / "toy.yaml")
    assert suite.trials[0].name == "1"
    assert (suite.labels, suite.published) == ({"1": "One"}, {"1": "qoa_v1"})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"experiments": {"a": {"configs": ["x.yaml"]}}}, "seeds"),
        ({"seeds": [0, 0], "experiments": {"a": {"configs": ["x.yaml"]}}}, "repeats"),
        ({"seeds": [0], "experiments": {"a": {"args": []}}}, "configs"),
        ({"seeds": [0], "experiment": {}}, r"unknown key 'experiment' \(did you mean 'experiments'\?\)"),
        ({"seeds": [0], "experiments": {"a": {"configs": ["missing.yaml"]}}}, "not found"),
        (
            {
                "seeds": [0],
                "experiments": {"a": {"configs": ["x.yaml"], "kernel": "knm"}, "knn": {"configs": ["x.yaml"]}},
            },
            r"`kernel` names another experiment of this suite, not 'knm' \(did you mean 'knn'\?\)",
        ),
        ({"seeds": [0], "experiments": {"a": {"configs": ["x.yaml"], "kernel": "a"}}}, "not 'a'"),
    ],
)
def test_bad_suites_are_clear_errors(tmp_path: Path, spec: dict, message: str) -> None:
    (tmp_path / "x.yaml").write_text("{}")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_suite(path)


LIFELONG_SEEDS = {
    "lifelong_scorecard": 1,
    "lifelong_encoder": 1,
    "lifelong_levers": 3,
    "lifelong_capacity": 3,
}  # else 5


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_shipped_suites_name_real_configs_and_paper_keys(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    suite = load_suite(path)
    if suite.budgets:  # a budget study (lifelong_budget_*, lifelong_goals_*): no paper numbers
        assert suite.benchmark is None
    if path.stem.startswith("lifelong"):  # a lifelong study: its committed tables' seeds (budget, goals, reuse: 5)
        assert suite.benchmark is None
        seeds = next((n for study, n in LIFELONG_SEEDS.items() if path.stem.startswith(study)), 5)
        assert len({t.seed for t in suite.trials}) == seeds
    else:  # a paper's stream, or one it never ran (no benchmark: no paper numbers beside it)
        assert len({t.seed for t in suite.trials}) == 3
    if suite.benchmark is not None:
        methods = published_numbers()["benchmarks"][suite.benchmark]["methods"]
        assert set(suite.published.values()) <= set(methods)
    for trial in suite.trials:
        assert all(Path(c).exists() for c in trial.configs)
        assert all(Path(c).exists() for c in suite.paper_configs[trial.name])


def _built(trial: Trial, tmp_path: Path):
    """The trial's model and stream as its fit would build them (the CLI without running)."""
    args = trial.fit_args(tmp_path / "logs")[1:]
    return cli_main(args, run=False)


def test_the_seed_reaches_permutations_splits_draws_and_init(tmp_path: Path) -> None:
    configs = (str(CONFIGS / "cbp_pmnist.yaml"), str(CONFIGS / "quick.yaml"))
    a, b, a_again = (_built(Trial("s", "cbp", seed, configs), tmp_path) for seed in (0, 1, 0))
    for cli, seed in ((a, 0), (b, 1)):
        assert cli.datamodule.stream.seed == seed
        assert cli.model.seed == seed
    stream_a, stream_b = a.datamodule.stream, b.datamodule.stream
    assert not torch.equal(stream_a.permutation(3), stream_b.permutation(3))
    assert not torch.equal(stream_a.split_indices(3)[0], stream_b.split_indices(3)[0])
    assert not torch.equal(
        a.model.step_generator().get_state(), b.model.step_generator().get_state()
    )  # learner's draws
    weights = [next(iter(cli.model.parameters())).detach() for cli in (a, b, a_again)]
    assert not torch.equal(weights[0], weights[1])  # initialisation (seed_everything)
    assert torch.equal(weights[0], weights[2])
    assert torch.equal(stream_a.permutation(3), a_again.datamodule.stream.permutation(3))


def _curve(log_dir: Path, tag: str = "eval/forward_acc") -> np.ndarray:
    return per_task(read_scalars(log_dir), 4)[tag]


def test_a_failing_trial_shows_its_error_and_log_and_fit_args_take_a_separate_value(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """#35: the console said `unfinished (… exit 2, last task None)` and still suggested `report`; `--fit-args
    '--data…'` (a separate value starting with `-`, as `sweep --help` writes it) was refused by argparse."""
    suite = _suite(tmp_path, [0], experiments=("a",))
    root = tmp_path / "logs"
    bad = ["--fit-args", "--model.init_args.hidden_sizes=wide"]
    assert sweep_main([str(suite), "--root", str(root), "--no-ray", *bad]) == 1
    out = capsys.readouterr().out
    log = root / "toy" / "a" / "seed_0" / "fit.log"
    (line,) = [x for x in out.splitlines() if x.startswith("    a/seed_0: unfinished")]
    assert "; error: model.init_args.hidden_sizes: expected list[int]" in line, line
    assert f"(the whole output: {log})" in line
    assert "cl_lightning report" not in out
    assert "none of 1 trials finished" in out


@pytest.mark.parametrize("where", ["suite", "--seeds"])
def test_a_negative_seed_is_refused_before_any_trial(tmp_path: Path, where: str) -> None:
    suite = _suite(tmp_path, [-1] if where == "suite" else [0])
    seeds = ["--seeds", "-1"] if where == "--seeds" else []
    with pytest.raises(ValueError, match=r"seed -1 is out of range: seeds are 0\.\.4294967295"):
        sweep_main([str(suite), "--root", str(tmp_path / "logs"), "--dry-run", *seeds])
    assert not (tmp_path / "logs").exists()


def test_sequential_sweep_runs_skips_and_records(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = _suite(tmp_path, [0], experiments=("a",))
    root = tmp_path / "logs"
    assert sweep_main([str(suite), "--root", str(root), "--no-ray"]) == 0
    assert "Ray" not in capsys.readouterr().out  # --no-ray: no advice about it
    d = root / "toy" / "a" / "seed_0"
    record = json.loads((d / "trial.json").read_text())
    assert record["status"] == FINISHED
    assert record["last_task"] == 3
    assert len(record["attempts"]) == 1
    assert record["attempts"][0]["peak_rss_bytes"] > 2**20
    assert (d / "checkpoints" / "last.ckpt").exists()
    assert not np.isnan(_curve(d)).any()
    assert yaml.safe_load((root / "toy" / "suite.yaml").read_text())["experiments"] == ["a"]
    monkeypatch.setattr(sweep, "_ray_available", lambda: False)  # as where the [sweep] extra is not installed
    assert sweep_main([str(suite), "--root", str(root)]) == 0  # everything finished: nothing runs
    out = capsys.readouterr().out
    assert "a/seed_0: already finished, skipped" in out
    assert "Ray is not installed: trials run one after another" in out
    assert 'pip install "cl-lightning[sweep]"' in out
    assert len(json.loads((d / "trial.json").read_text())["attempts"]) == 1


def test_a_trial_whose_folder_moved_resumes_from_lightnings_versioned_last(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """After its run folder moved, Lightning keeps ``last.ckpt`` and writes ``last-v1.ckpt``: a sweep resumes the
    trial from the most finished of them (as ``fit --ckpt_path last`` does), never starts it over."""
    suite = _suite(tmp_path, [0], experiments=("a",))
    trial = load_suite(suite).trials[0]
    checkpoints = trial.log_dir(tmp_path / "logs") / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save({"epoch": 3}, checkpoints / "last-v1.ckpt")
    assert trial_state(trial, tmp_path / "logs") == "resume"
    torch.save({"epoch": 1}, checkpoints / "last.ckpt")
    assert resume_point(trial.log_dir(tmp_path / "logs")) == checkpoints / "last-v1.ckpt"
    sweep_main([str(suite), "--root", str(tmp_path / "logs"), "--dry-run"])
    assert f"--ckpt_path {checkpoints / 'last-v1.ckpt'}" in capsys.readouterr().out  # what the resume takes


@pytest.mark.slow
def test_two_seeds_differ_and_one_seed_twice_gives_the_same_run(tmp_path: Path) -> None:
    suite = load_suite(_suite(tmp_path, [5, 6], experiments=("a",)))
    run_sequential(suite.trials, str(tmp_path / "one"))
    run_sequential(suite.trials[:1], str(tmp_path / "two"))
    for tag in ("eval/forward_acc", "eval/backward_acc", "train/online_acc", "train/loss"):
        one, two = (_curve(tmp_path / r / "toy" / "a" / "seed_5", tag) for r in ("one", "two"))
        np.testing.assert_array_equal(one, two)
        other = _curve(tmp_path / "one" / "toy" / "a" / "seed_6", tag)
        assert not np.array_equal(one, other)


@pytest.mark.slow
def test_two_trials_through_ray_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from cl_lightning.study.sweep import run_on_ray

    suite = load_suite(_suite(tmp_path, [0], experiments=("a", "b")))
    records = run_on_ray(suite.trials, str(tmp_path / "logs"), address=None, cpus=1, gpus=0)
    assert sorted(r["name"] for r in records) == ["a", "b"]
    assert all(r["status"] == FINISHED for r in records)
    for t in suite.trials:
        assert trial_state(t, tmp_path / "logs") == FINISHED
        assert not np.isnan(_curve(t.log_dir(tmp_path / "logs"))).any()


@pytest.mark.slow
def test_sigterm_to_a_ray_sweep_records_the_stopped_trial(tmp_path: Path) -> None:
    """On Ray a SIGTERM to the sweep cancels the running trial: its fit stops cleanly and its attempt is recorded
    (``stopped``, with its wall time), and running the sweep again finishes it from the checkpoint."""
    pytest.importorskip("ray")
    suite = _suite(tmp_path, [0], tasks=60, experiments=("a",))
    root = tmp_path / "logs"
    a_dir = root / "toy" / "a" / "seed_0"
    cmd = [sys.executable, "-m", "cl_lightning", "sweep", str(suite), "--root", str(root), "--cpus-per-trial", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not (a_dir / "checkpoints" / "last.ckpt").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, out
    record = json.loads((a_dir / "trial.json").read_text())
    assert record["status"] == "stopped", out
    assert record["last_task"] < 59
    assert record["attempts"][-1]["wall_seconds"] > 0
    assert "a/seed_0: stopped" in out

    assert sweep_main([str(suite), "--root", str(root), "--no-ray"]) == 0
    record = json.loads((a_dir / "trial.json").read_text())
    assert record["status"] == FINISHED
    assert record["attempts"][-1]["resumed_from"].endswith("last.ckpt")
    assert not (a_dir / "stop.request").exists()


def _resumed_equals_uninterrupted(trial_dir: Path, trial: Trial, straight_root: Path) -> None:
    """The trial in ``trial_dir`` finished on a resumed attempt, and its curves equal those of the same trial run
    uninterrupted under ``straight_root``."""
    record = json.loads((trial_dir / "trial.json").read_text())
    assert record["status"] == FINISHED
    assert record["attempts"][-1]["resumed_from"].endswith("last.ckpt")
    run_sequential([trial], str(straight_root))
    for tag in ("eval/forward_acc", "eval/backward_acc", "train/online_acc"):
        resumed, whole = _curve_n(trial_dir, tag), _curve_n(trial.log_dir(straight_root), tag)
        if tag.startswith("train/"):
            # the checkpoint is written after a task's evaluation and before its training means are logged: a
            # kill in between loses that one task's training means (the resumed run starts at the next task)
            assert np.isnan(resumed).sum() <= 1
            resumed[np.isnan(resumed)] = whole[np.isnan(resumed)]
        np.testing.assert_array_equal(resumed, whole)


@pytest.mark.slow
def test_killed_sweep_rerun_skips_finished_and_resumes_unfinished(tmp_path: Path) -> None:
    suite = _suite(tmp_path, [0], tasks=4, experiments=("a",))
    # b: the same run, 40 tasks, so there is time to kill it after a checkpoint
    spec = yaml.safe_load(suite.read_text())
    long = tmp_path / "long.yaml"
    long.write_text(yaml.safe_dump({"data": {"stream": {"init_args": {"num_tasks": 40}}}}))
    spec["experiments"]["b"] = {"configs": [str(tmp_path / "tiny.yaml"), str(long)]}
    suite.write_text(yaml.safe_dump(spec))
    root = tmp_path / "logs"
    b_dir = root / "toy" / "b" / "seed_0"
    cmd = [sys.executable, "-m", "cl_lightning", "sweep", str(suite), "--root", str(root), "--no-ray"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not (b_dir / "checkpoints" / "last.ckpt").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a few more tasks
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its running fit
    proc.wait()
    a_record = (root / "toy" / "a" / "seed_0" / "trial.json").read_text()
    assert json.loads(a_record)["status"] == FINISHED
    assert not (b_dir / "trial.json").exists()

    assert sweep_main([str(suite), "--root", str(root), "--no-ray"]) == 0
    assert (root / "toy" / "a" / "seed_0" / "trial.json").read_text() == a_record  # skipped, untouched
    _resumed_equals_uninterrupted(b_dir, load_suite(suite).trials[1], tmp_path / "straight")


def _curve_n(log_dir: Path, tag: str, n: int = 40) -> np.ndarray:
    return per_task(read_scalars(log_dir), n)[tag]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_a_trial_process_dies_with_its_sweep() -> None:
    # a parent starts a child as run_trial does, then is killed outright: the child must not keep running
    code = (
        "import subprocess, sys, time\n"
        "from cl_lightning.study.childproc import die_with_parent\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], preexec_fn=die_with_parent)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    status = Path(f"/proc/{child}/status")
    deadline = time.time() + 10
    while status.exists() and "State:\tZ" not in status.read_text() and time.time() < deadline:
        time.sleep(0.05)
    assert not status.exists() or "State:\tZ" in status.read_text()  # gone, or dead and waiting to be reaped


def test_a_finished_trial_is_extended_when_its_suite_asks_for_more_tasks(tmp_path: Path) -> None:
    """A finished trial that kept its checkpoint runs on to the longer stream its suite now asks for; with its
    probe set pinned (probe_span) the extended run's curves equal an uninterrupted run of the longer stream."""
    suite = _suite(tmp_path, [0], tasks=3, experiments=("a",))
    spec = yaml.safe_load(suite.read_text())
    spec["experiments"]["a"]["args"] = ["--data.stream.init_args.num_tasks=3", "--data.probe_span=3"]
    suite.write_text(yaml.safe_dump(spec))
    root = tmp_path / "logs"
    assert sweep_main([str(suite), "--root", str(root), "--no-ray"]) == 0
    d = root / "toy" / "a" / "seed_0"
    assert json.loads((d / "trial.json").read_text())["num_tasks"] == 3
    spec["experiments"]["a"]["args"][0] = "--data.stream.init_args.num_tasks=6"
    suite.write_text(yaml.safe_dump(spec))
    (trial,) = load_suite(suite).trials
    assert trial_state(trial, root) == "extend"
    assert sweep_main([str(suite), "--root", str(root), "--no-ray"]) == 0
    record = json.loads((d / "trial.json").read_text())
    assert (record["status"], record["num_tasks"], record["last_task"]) == (FINISHED, 6, 5)
    assert record["attempts"][-1]["resumed_from"].endswith("last.ckpt")
    run_sequential([trial], str(tmp_path / "straight"))
    for tag in ("eval/forward_acc", "eval/backward_acc", "train/online_acc", "eval/acc_matrix/task_2"):
        np.testing.assert_array_equal(_curve_n(d, tag, 6), _curve_n(trial.log_dir(tmp_path / "straight"), tag, 6))
    for ckpt in (d / "checkpoints").iterdir():  # a finished trial without its checkpoints cannot go on
        ckpt.unlink()
    spec["experiments"]["a"]["args"][0] = "--data.stream.init_args.num_tasks=8"
    suite.write_text(yaml.safe_dump(spec))
    with pytest.raises(UsageError, match="finished 6 tasks and its suite now asks for 8, but its checkpoint"):
        sweep_main([str(suite), "--root", str(root), "--no-ray"])


def test_a_grid_entry_expands_to_one_experiment_per_point(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Axes multiply (the first slowest); a mapping value sets several fields; every {field} of the name, label,
    arguments and budget takes the point's value; --dry-run lists the expansion."""
    (tmp_path / "x.yaml").write_text("{}")
    grid = {
        "learner_{mode}_{budget}": {
            "label": "{mode} at {budget} B",
            "configs": ["x.yaml"],
            "budget": "{budget}",
            "args": ["--model.buffer_mode={mode}", "--model.memory_size={rows}"],
            "grid": {
                "mode": ["fifo", "reservoir"],
                "size": [{"budget": 1024, "rows": 4}, {"budget": 4096, "rows": 19}],
            },
        },
        "plain": {"configs": ["x.yaml"]},
    }
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0], "experiments": grid}))
    suite = load_suite(path)
    names = ["learner_fifo_1024", "learner_fifo_4096", "learner_reservoir_1024", "learner_reservoir_4096", "plain"]
    assert [t.name for t in suite.trials] == names
    assert suite.trials[3].args == ("--model.buffer_mode=reservoir", "--model.memory_size=19")
    assert suite.labels["learner_reservoir_4096"] == "reservoir at 4096 B"
    assert suite.budgets == {"learner_fifo_1024": 1024, "learner_fifo_4096": 4096, "learner_reservoir_1024": 1024,
                             "learner_reservoir_4096": 4096}  # fmt: skip
    assert sweep_main([str(path), "--root", str(tmp_path / "logs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "learner_reservoir_4096/seed_0 [new]: python -m cl_lightning fit --config " in out
    assert out.count("[new]") == 5


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"configs": ["x.yaml"], "grid": {"k": [1, 2]}}, "the same name twice"),
        ({"configs": ["x.yaml"], "args": ["--a={missing}"], "grid": {"k": [1]}}, "names a field the grid does not"),
        ({"configs": ["x.yaml"], "grid": {"k": []}}, "non-empty list"),
    ],
    ids=["name-without-its-field", "unknown-field", "empty-axis"],
)
def test_a_bad_grid_is_a_clear_error(tmp_path: Path, entry: dict, message: str) -> None:
    (tmp_path / "x.yaml").write_text("{}")
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0], "experiments": {"e": entry}}))
    with pytest.raises(UsageError, match=message):
        load_suite(path)


@pytest.mark.skipif(not sweep._ray_available(), reason="Ray is not installed (the [sweep] extra)")
@pytest.mark.parametrize(
    ("address", "message"),
    [("auto", "Could not find any running Ray instance"), ("127.0.0.1:9", "no Ray head answers there")],
    ids=["no-cluster", "closed-port"],
)
def test_a_ray_address_without_a_cluster_is_one_line_and_writes_nothing(
    tmp_path: Path, address: str, message: str
) -> None:
    """#48: `--address auto` with no cluster printed "error: None: None" after writing suite.yaml; a host:port
    nobody answers is refused before Ray waits on it."""
    suite = _suite(tmp_path, [0], experiments=("a",))
    root = tmp_path / "logs"
    with pytest.raises(UsageError, match=message) as raised:
        sweep_main([str(suite), "--root", str(root), "--address", address])
    assert "\n" not in str(raised.value)
    assert not root.exists()


@contextlib.contextmanager
def _ray_head() -> Iterator[None]:
    """`ray start --head` on a free port for the block, `ray stop --force` after it (which stops every Ray head of
    the machine: run it where no other Ray is wanted)."""
    import shutil
    import socket

    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent))
    assert ray_cli is not None
    with socket.socket() as s:  # a free port for the head
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head = [ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
            "--disable-usage-stats"]  # fmt: skip
    subprocess.run(head, check=True, capture_output=True, timeout=120)
    try:
        yield
    finally:
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(not sweep._ray_available(), reason="Ray is not installed (the [sweep] extra)")
def test_a_sweep_on_a_real_ray_head_equals_the_local_sweep(tmp_path: Path) -> None:
    """#47 item 5: `ray start --head`, then `sweep --address auto` joins it: the trials run as the head's tasks and log
    the same curves as the same suite run locally, one after another, and `report` gives the same table but for the
    clocks. (An explicit host:port needs the head's
    authentication token on Ray 2.60's default settings, which this machine's head does not hand to a driver.)"""
    suite = _suite(tmp_path, [0], experiments=("a", "b"))
    on_ray, local = tmp_path / "on_ray", tmp_path / "local"
    with _ray_head():
        assert sweep_main([str(suite), "--root", str(on_ray), "--address", "auto"]) == 0
    assert sweep_main([str(suite), "--root", str(local), "--no-ray"]) == 0
    tables = []
    for root in (on_ray, local):  # the report's table, every column but the clocks'
        assert report_main([str(root / "toy"), "--out", str(root / "report")]) == 0
        rows = list(csv.DictReader((root / "report" / "table.csv").open()))
        tables.append([{k: v for k, v in row.items() if "seconds" not in k and "rss" not in k} for row in rows])
    assert tables[0] == tables[1]
    assert {row["experiment"] for row in tables[0]} == {"a", "b"}
    for name in ("a", "b"):
        ray_dir, local_dir = (root / "toy" / name / "seed_0" for root in (on_ray, local))
        assert json.loads((ray_dir / "trial.json").read_text())["status"] == FINISHED
        for tag in ("eval/forward_acc", "eval/backward_acc", "train/online_acc"):
            np.testing.assert_array_equal(_curve_n(ray_dir, tag, 4), _curve_n(local_dir, tag, 4))


def _kill_fit(root: Path) -> int:
    """SIGKILL the ``fit`` process logging under ``root`` (Linux: found by its command line in /proc); its pid."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if b"fit" in args and any(str(root).encode() in a for a in args):
                pid = int(cmdline.parent.name)
                os.kill(pid, signal.SIGKILL)
                return pid
    raise AssertionError(f"no fit process logs under {root}")


@pytest.mark.slow
@pytest.mark.skipif(not sweep._ray_available(), reason="Ray is not installed (the [sweep] extra)")
def test_a_trial_killed_on_a_ray_head_resumes_at_the_next_sweep(tmp_path: Path) -> None:
    """#47 item 5: the fit of a trial running as a Ray head's task is killed (-9) after its first checkpoints; the
    sweep records the failed attempt, and the next `sweep --address auto` resumes the trial from its last checkpoint,
    nothing lost: its curves equal an uninterrupted local run's."""
    suite = _suite(tmp_path, [0], tasks=40, experiments=("a",))
    root = tmp_path / "on_ray"
    a_dir = root / "toy" / "a" / "seed_0"
    cmd = [sys.executable, "-m", "cl_lightning", "sweep", str(suite), "--root", str(root), "--address", "auto"]
    with _ray_head():
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        while not (a_dir / "checkpoints" / "last.ckpt").exists() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a few more tasks
        _kill_fit(root)
        out, _ = proc.communicate(timeout=300)
        record = json.loads((a_dir / "trial.json").read_text())
        assert record["status"] != FINISHED, out
        assert record["attempts"][-1]["returncode"] == -signal.SIGKILL, out
        assert sweep_main([str(suite), "--root", str(root), "--address", "auto"]) == 0
    _resumed_equals_uninterrupted(a_dir, load_suite(suite).trials[0], tmp_path / "straight")
