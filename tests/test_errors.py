"""Bad input to any command (fit, validate, test, sweep, report): one `error:` line, exit code 2, no traceback, and
nothing new or changed under the folder it runs in (its log root).

Every case runs through the command line's entry point, ``python -m cl_lightning``'s ``main``: in this process by
default (fast), and each in its own ``python -m cl_lightning`` process in the slow run."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import BACKPROP, QOA, ROOT, tiny_args

from cl_lightning.__main__ import main as entry
from cl_lightning.run.cli import main

CHECKPOINT = ["--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_last=true"]
HERE = Path(".")  # each case runs in its own empty folder: logs go to ./logs
SUITE_TINY = {  # the config a suite's trials name (never run here)
    "trainer": {"logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"name": "t"}}},
    "model": {"class_path": "cl_lightning.learners.Backprop"},
    "data": {"stream": {"class_path": "cl_lightning.data.SyntheticClasses", "init_args": {"num_tasks": 2}}},
}


def fit(*extra: str, learner: list[str] = BACKPROP, tasks: int = 3) -> list[str]:
    return ["fit", *tiny_args(HERE, learner, tasks=tasks, extra=list(extra))]


# name -> (arguments, a fragment the error line must contain); {w}: the folder of the files below, {ckpt}: a
# one-task Backprop checkpoint (its run, logs/tiny/version_0, is copied into the case's folder for `*resume*` cases)
CASES: dict[str, tuple[list[str], str]] = {
    # --- config and command line (the first 23) ---
    "unknown learner": (fit(learner=["--model=Backprp"]), "did you mean 'Backprop'"),
    "misspelt key in YAML": (
        fit("--config", "{w}/misspelt.yaml"),
        "misspelt.yaml:3: model.init_args.hiden_sizes: Backprop has no option 'hiden_sizes'",
    ),
    "misspelt key on the command line": (fit("--model.hidden_size=[8]"), "did you mean 'hidden_sizes'"),
    "misspelt optimizer key": (fit("--model.optimizer.lrr=0.1"), "Adam has no option 'lrr'"),
    "wrong type": (fit("--model.hidden_sizes=wide"), "model.init_args.hidden_sizes: expected list[int]"),
    "value outside a choice": (fit("--model.init=he"), "expected one of 'kaiming', 'xavier', 'default'"),
    "missing config file": (fit("--config", "{w}/nope.yaml"), "nope.yaml': no such file"),
    "support size 0": (fit("--model.support_size=0", learner=QOA), "support_size must be >= 1"),
    "support larger than the buffer": (
        fit("--model.support_size=500", learner=QOA),
        "500 is larger than memory_size 128",
    ),
    "chunk larger than a task": (fit("--data.stream.chunk_size=100000"), "larger than a task's train_size"),
    "chunk 0": (fit("--data.stream.chunk_size=0"), "chunk_size must be >= 1, got 0"),
    "negative task count": (fit("--data.stream.num_tasks=-3"), "num_tasks must be >= 1, got -3"),
    "zero task count": (fit("--data.stream.num_tasks=0"), "num_tasks must be >= 1, got 0"),
    "warm-up as long as the stream": (
        fit("--data.stream.warmup_tasks=3"),
        "warmup_tasks must be in 0..num_tasks - 1 = 2 (at least one task is evaluated), got 3",
    ),
    "negative warm-up": (fit("--data.stream.warmup_tasks=-1"), "warmup_tasks must be in 0..num_tasks - 1"),
    "max_epochs against the stream": (fit("--trainer.max_epochs=7"), "must equal data.stream.init_args"),
    "empty data folder": (
        fit(
            "--data.stream=cl_lightning.data.PermutedMNIST", "--data.stream.num_tasks=2", "--data.stream.data_root={w}"
        ),
        "MNIST train files not found under",
    ),
    "missing checkpoint": (fit("--ckpt_path={w}/nothing.ckpt"), "nothing.ckpt: no such file"),
    "truncated checkpoint": (fit("--ckpt_path={w}/truncated.ckpt"), "not a readable checkpoint"),
    "changed hyperparameter": (
        fit("--model.optimizer.lr=0.5", "--ckpt_path={ckpt}"),
        "optimizer.init_args.lr: checkpoint 0.01, config 0.5. Fix the config, or pass --accept_changed_hparams true",
    ),
    "another stream's checkpoint": (
        fit("--ckpt_path={ckpt}", "--data.stream.seed=3"),
        "data.stream.init_args.seed: checkpoint 0, config 3",
    ),
    "nothing to resume": (fit("--ckpt_path=last"), "no run under logs/tiny/ to resume"),
    "unknown option": (fit("--trainer.max_epochz=3"), "unrecognized arguments"),
    "invalid learning rate": (fit("--model.optimizer.lr=-1"), "Invalid learning rate"),
    # --- #35: messages that named no file, no value, or accepted a mistake ---
    "misspelt top-level key in YAML": (
        fit("--config", "{w}/top.yaml"),
        "top.yaml:1: trainr: unknown key (did you mean 'trainer'?); the top-level keys: seed_everything, trainer,",
    ),
    "abbreviated option": (
        fit("--trainer.max_epoch=3"),
        "unrecognized arguments: --trainer.max_epoch=3 (did you mean 'trainer.max_epochs'?)",
    ),
    "folder as checkpoint": (fit("--ckpt_path={w}"), "a folder, not a checkpoint file; it holds no checkpoint"),
    "negative backward lag": (fit("--data.backward_lag=-1"), "StreamDataModule: backward_lag must be >= 1, got -1"),
    "negative context": (fit("--data.context_size=-5"), "StreamDataModule: context_size must be >= 0, got -5"),
    "empty query set": (fit("--data.stream.query_size=0"), "SyntheticClasses: query_size must be >= 1, got 0"),
    "a monitor's cadence of 0": (
        fit("--callbacks.hessian.every_n_tasks=0"),
        "every_n_tasks, num_queries, top_k and query_chunk must be positive, got every_n_tasks=0",
    ),
    "misspelt inherited key": (  # an option a learner takes through **kwargs is suggested and listed too
        fit(learner=["--model=EWC", "--model.init_args.seeed=1"]),
        "EWC has no option 'seeed' (did you mean 'seed'?); its options: ewc_lambda, num_penalties, fisher_samples, "
        "hidden_sizes, init, encoder, step_kernel, optimizer, seed",
    ),
    # --- files the user wrote: the file and line ---
    "YAML that does not parse": (fit("--config", "{w}/broken.yaml"), "broken.yaml:4:5: not valid YAML: expected ','"),
    "misspelt include": (fit("--config", "{w}/includes.yaml"), "includes.yaml:1: included 'nope.yaml' not found"),
    # --- classes ---
    "abstract base as learner": (
        fit(learner=["--model=ReplayLearner"]),
        "model: ReplayLearner is an abstract base class, not something to run; choose one of: EWC, KNN, Backprop",
    ),
    "unknown class through class_path": (
        fit("--model.class_path=cl_lightning.learners.Nope"),
        "model: unknown class 'cl_lightning.learners.Nope'; choose one of: EWC, KNN",
    ),
    "unknown class in a YAML file": (fit("--config", "{w}/class.yaml"), "class.yaml:1: model: unknown class 'Backprp'"),
    # --- checkpoints and resumes ---
    "another learner's checkpoint": (
        fit("--ckpt_path={ckpt}", learner=QOA),
        "cannot be resumed with this config: the checkpoint is a Backprop, the config asks for a QueryOnlyAttention. "
        "Use the config it was trained with",
    ),
    "another learner's checkpoint, changes accepted": (
        fit("--ckpt_path={ckpt}", "--accept_changed_hparams=true", learner=QOA),
        "cannot be resumed with this config: the checkpoint is a Backprop",
    ),
    "other layer sizes, changes accepted": (
        fit("--ckpt_path={ckpt}", "--accept_changed_hparams=true", "--model.hidden_sizes=[16]"),
        "hidden_sizes: checkpoint [32, 32], config [16]; weight net.layers.0.bias has shape [32] in the checkpoint, "
        "[16] here",
    ),
    "refused resume of its own run": (
        fit("--model.optimizer.lr=0.5", *CHECKPOINT, "--ckpt_path=last", tasks=1),
        "optimizer.init_args.lr: checkpoint 0.01, config 0.5",
    ),
    "refused resume of another learner in its own run": (
        fit(*CHECKPOINT, "--ckpt_path=last", learner=QOA, tasks=1),
        "the checkpoint is a Backprop, the config asks for a QueryOnlyAttention",
    ),
    # --- the other Lightning commands ---
    "validate with a wrong type": (
        ["validate", *tiny_args(HERE, BACKPROP, extra=["--model.hidden_sizes=wide"])],
        "model.init_args.hidden_sizes: expected list[int]",
    ),
    "test with nothing to resume": (
        ["test", *tiny_args(HERE, BACKPROP, extra=["--ckpt_path=last"])],
        "no run under logs/tiny/ to resume",
    ),
    "wrong command": (["fitt", "--config", "x.yaml"], "no command 'fitt' (did you mean 'fit'?); choose one of: fit, "),
    # --- sweep ---
    "suite key misspelt": (["sweep", "{w}/suite_seed.yaml"], "suite_seed.yaml:1: unknown key 'seed' (did you mean"),
    "suite experiment key misspelt": (
        ["sweep", "{w}/suite_confgs.yaml"],
        "suite_confgs.yaml:4: unknown key 'confgs' (did you mean 'configs'?)",
    ),
    "suite config missing": (["sweep", "{w}/suite_missing.yaml"], "suite_missing.yaml:4: config 'nope.yaml' not found"),
    "suite wrong type": (
        ["sweep", "{w}/suite_type.yaml"],
        "suite_type.yaml:1: `seeds` must be a non-empty list of integers, got '0-2'",
    ),
    "suite YAML that does not parse": (["sweep", "{w}/suite_broken.yaml"], "suite_broken.yaml:2:12: not valid YAML"),
    "suite file missing": (["sweep", "{w}/nope.yaml"], "nope.yaml: no such file"),
    "sweep --only an unknown experiment": (
        ["sweep", "{w}/suite.yaml", "--only", "qoa"],
        "--only qoa: no such experiment in {w}/suite.yaml; choose from: a, b",
    ),
    "sweep option misspelt": (["sweep", "{w}/suite.yaml", "--dry-rn"], "unrecognized arguments: --dry-rn"),
    # --- report ---
    "report of a folder without trials": (["report", "{w}"], "no runs with event files"),
    "report without a folder": (["report"], "the following arguments are required: suite_dir"),
}
if not torch.cuda.is_available():
    CASES["GPU asked for on a machine without one"] = (
        fit("--trainer.accelerator=gpu"),
        "trainer.accelerator=gpu: No supported gpu backend found!; without one use --trainer.accelerator cpu",
    )


IDS = [name.replace(" ", "_").replace("'", "").replace(",", "") for name in sorted(CASES)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the cases name, and a real one-task Backprop run (``made/logs/tiny/version_0``)."""
    w = tmp_path_factory.mktemp("world")
    made = w / "made"
    made.mkdir()
    cwd = Path.cwd()
    os.chdir(made)
    try:
        main(fit(*CHECKPOINT, tasks=1))
    finally:
        os.chdir(cwd)
    ckpt = made / "logs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    (w / "truncated.ckpt").write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    (w / "tiny.yaml").write_text(yaml.safe_dump(SUITE_TINY))
    files = {
        "misspelt.yaml": "model:\n  init_args:\n    hiden_sizes: [16]\n",
        "broken.yaml": "model:\n  init_args:\n    hidden_sizes: [1\n   x: 2\n",
        "includes.yaml": "include: [nope.yaml]\n",
        "class.yaml": "model:\n  class_path: Backprp\n",
        "top.yaml": "trainr:\n  max_epochs: 3\n",
        "suite_seed.yaml": "seed: [0]\nexperiments:\n  a:\n    configs: [tiny.yaml]\n",
        "suite_confgs.yaml": "seeds: [0]\nexperiments:\n  a:\n    confgs: [tiny.yaml]\n",
        "suite_missing.yaml": "seeds: [0]\nexperiments:\n  a:\n    configs: [nope.yaml]\n",
        "suite_type.yaml": "seeds: 0-2\nexperiments:\n  a:\n    configs: [tiny.yaml]\n",
        "suite_broken.yaml": "seeds: [0\nexperiments: {}\n",
        "suite.yaml": "seeds: [0]\nexperiments:\n  a:\n    configs: [tiny.yaml]\n  b:\n    configs: [tiny.yaml]\n",
    }
    for name, text in files.items():
        (w / name).write_text(text)
    return w


def _case(name: str, world: Path, tmp_path: Path) -> tuple[list[str], str, Path]:
    """The case's arguments and fragment, and its folder (with a copy of the made run for a resume of its own)."""
    template, fragment = CASES[name]
    ckpt = world / "made" / "logs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    args = [a.format(w=world, ckpt=ckpt) for a in template]
    folder = tmp_path / "case"
    folder.mkdir()
    if "own run" in name:
        shutil.copytree(world / "made" / "logs", folder / "logs")
    return args, fragment.format(w=world), folder


def _tree(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` and a digest of each file's contents."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def _assert_one_line(code: int | str | None, err: str, fragment: str) -> None:
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2, err
    assert len(errors) == 1, err
    assert fragment in errors[0], errors[0]
    assert "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.strip()] == errors, err  # no library line before it
    assert "usage:" not in err, err
    assert "Union subtypes" not in errors[0], errors[0]
    if "abstract base" in fragment:
        assert "ReplayLearner" not in errors[0].split("choose one of:")[1]
    if "cannot be resumed" in fragment:
        assert "accept_changed_hparams" not in errors[0]


@pytest.mark.parametrize("name", sorted(CASES), ids=IDS)
def test_mistake_gives_one_line_exit_2_and_writes_nothing(
    name: str, world: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, fragment, folder = _case(name, world, tmp_path)
    monkeypatch.chdir(folder)
    before = _tree(folder)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        entry(args)
    _assert_one_line(stop.value.code, capsys.readouterr().err, fragment)
    assert _tree(folder) == before


def _in_own_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cl_lightning", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # one process start per case: ~10 s each on 2 busy cores
@pytest.mark.parametrize("name", sorted(CASES), ids=IDS)
def test_mistake_in_its_own_process(name: str, world: Path, tmp_path: Path) -> None:
    args, fragment, folder = _case(name, world, tmp_path)
    before = _tree(folder)
    done = _in_own_process(args, folder)
    _assert_one_line(done.returncode, done.stderr, fragment)
    assert _tree(folder) == before


def test_error_in_a_subprocess_has_no_traceback_and_debug_shows_it(tmp_path: Path) -> None:
    """The real entry point: exit code 2 and one line; `--debug` raises the error itself."""
    cmd = [sys.executable, "-m", "cl_lightning", "fit", *tiny_args(tmp_path, QOA, extra=["--model.support_size=0"])]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    plain = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 2
    assert "Traceback" not in plain.stderr
    assert [line for line in plain.stderr.splitlines() if line.startswith("error:")] == [
        "error: QueryOnlyAttention: support_size must be >= 1 and online_queries >= 0 (traceback: --debug)"
    ]
    assert not (tmp_path / "logs").exists()
    with pytest.raises(ValueError, match="support_size must be >= 1"):  # --debug: the error
        main([*cmd[3:], "--debug"])


def test_debug_shows_a_suite_error_as_raised(world: Path) -> None:
    with pytest.raises(ValueError, match="unknown key 'seed'"):
        entry(["sweep", str(world / "suite_seed.yaml"), "--debug"])


def test_dry_run_lists_the_trials_and_writes_nothing(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as stop:
        entry(["sweep", str(world / "suite.yaml"), "--root", str(tmp_path / "logs"), "--dry-run"])
    assert stop.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["a/seed_0 [new]", "b/seed_0 [new]"]
    assert not (tmp_path / "logs").exists()


def test_help_says_what_the_package_is_and_starts_with_the_demo(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "continual learning from a stream" in out
    assert "--model.help QueryOnlyAttention" in out
    demo = "fit --config configs/qoa_pmnist.yaml --config configs/quick_demo.yaml --config configs/quick_qoa.yaml"
    assert demo in out
    assert "configs/quick.yaml" not in out  # its QOA setting sits at chance (README's quick-config table)


def test_report_names_the_trials_it_could_not_read(world: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An empty and a corrupt event file are named, not silently counted as unfinished trials."""
    made = world / "made" / "logs" / "tiny" / "version_0"
    good = tmp_path / "suite" / "a" / "seed_0"
    shutil.copytree(made, good, ignore=shutil.ignore_patterns("checkpoints"))
    empty, corrupt = tmp_path / "suite" / "a" / "seed_1", tmp_path / "suite" / "a" / "seed_2"
    for folder, content in ((empty, b""), (corrupt, b"\x00not an event file" * 20)):
        folder.mkdir()
        (folder / "events.out.tfevents.1.host.1.0").write_bytes(content)
    with pytest.raises(SystemExit) as stop:
        entry(["report", str(tmp_path / "suite")])
    assert stop.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("could not read")] == [
        f"could not read {empty} (its values are missing below): events.out.tfevents.1.host.1.0 (empty)",
        f"could not read {corrupt} (its values are missing below): events.out.tfevents.1.host.1.0 (no readable "
        "event: corrupt or not an event file)",
    ]
    assert any("| 3 (2 unfinished) |" in line for line in out)


def test_an_unreadable_checkpoint_message_is_never_cut_mid_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cl_lightning.run import checkpointing

    path = tmp_path / "x.ckpt"
    path.write_bytes(b"junk")
    monkeypatch.setattr(checkpointing.torch, "load", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("word " * 40)))
    with pytest.raises(checkpointing.CheckpointError) as refused:
        checkpointing.read_checkpoint(path)
    inside = str(refused.value).split("torch.save: ", 1)[1]
    assert inside.endswith("word …)"), inside


def test_a_mistake_found_after_the_trainer_is_built_is_the_only_line_on_stderr(tmp_path: Path) -> None:
    """#35: `Seed set to 0` and `GPU available: …` came before the `error:` line; they wait for the run now."""
    done = _in_own_process(["fit", *tiny_args(tmp_path, BACKPROP, extra=["--trainer.max_epochs=7"])], tmp_path)
    assert done.returncode == 2
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        "error: trainer.max_epochs (7) must equal data.stream.init_args.num_tasks (3): one epoch is one task; leave "
        "max_epochs unset and the CLI fills it in (traceback: --debug)"
    ], done.stderr
