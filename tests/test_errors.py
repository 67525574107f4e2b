"""Bad input: every config or command-line mistake ends in one `error:` line, exit code 2, no traceback, and no new
folder under the run's log directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BACKPROP, QOA, ROOT, tiny_args

from cl_lightning.cli import main

CHECKPOINT = ["--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_last=true"]


@pytest.fixture(scope="module")
def backprop_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real one-task Backprop checkpoint (the run's last.ckpt)."""
    root = tmp_path_factory.mktemp("ckpt")
    main(["fit", *tiny_args(root, BACKPROP, tasks=1, extra=CHECKPOINT)])
    path = root / "logs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert path.is_file()
    return path


def _bad_inputs(tmp: Path, ckpt: Path) -> dict[str, tuple[list[str], list[str], str]]:
    """name -> (learner args, extra args, a fragment the message must contain)."""
    misspelt = tmp / "misspelt.yaml"
    misspelt.write_text("model:\n  init_args:\n    hiden_sizes: [16]\n")
    truncated = tmp / "truncated.ckpt"
    truncated.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    empty = tmp / "empty_data"
    empty.mkdir(exist_ok=True)
    mnist = ["--data.stream=cl_lightning.data.PermutedMNIST", "--data.stream.num_tasks=2"]
    mnist.append(f"--data.stream.data_root={empty}")
    return {
        "unknown learner": (["--model=Backprp"], [], "did you mean 'Backprop'"),
        "misspelt key in YAML": (BACKPROP, ["--config", str(misspelt)], "Backprop has no option 'hiden_sizes'"),
        "misspelt key on the command line": (BACKPROP, ["--model.hidden_size=[8]"], "did you mean 'hidden_sizes'"),
        "misspelt optimizer key": (BACKPROP, ["--model.optimizer.lrr=0.1"], "Adam has no option 'lrr'"),
        "wrong type": (BACKPROP, ["--model.hidden_sizes=wide"], "model.init_args.hidden_sizes: expected list[int]"),
        "value outside a choice": (BACKPROP, ["--model.init=he"], "expected one of 'kaiming', 'xavier', 'default'"),
        "missing config file": (BACKPROP, ["--config", str(tmp / "nope.yaml")], "nope.yaml': no such file"),
        "support size 0": (QOA, ["--model.support_size=0"], "support_size must be >= 1"),
        "support larger than the buffer": (QOA, ["--model.support_size=500"], "500 is larger than memory_size 128"),
        "chunk larger than a task": (BACKPROP, ["--data.stream.chunk_size=100000"], "larger than a task's train_size"),
        "chunk 0": (BACKPROP, ["--data.stream.chunk_size=0"], "chunk_size must be >= 1, got 0"),
        "negative task count": (BACKPROP, ["--data.stream.num_tasks=-3"], "num_tasks must be >= 1, got -3"),
        "zero task count": (BACKPROP, ["--data.stream.num_tasks=0"], "num_tasks must be >= 1, got 0"),
        "warm-up as long as the stream": (
            BACKPROP,
            ["--data.stream.warmup_tasks=3"],
            "warmup_tasks must be in 0..num_tasks - 1 = 2 (at least one task is evaluated), got 3",
        ),
        "negative warm-up": (BACKPROP, ["--data.stream.warmup_tasks=-1"], "warmup_tasks must be in 0..num_tasks - 1"),
        "max_epochs against the stream": (BACKPROP, ["--trainer.max_epochs=7"], "must equal data.stream.init_args"),
        "empty data folder": (BACKPROP, mnist, f"MNIST train files not found under {empty}"),
        "missing checkpoint": (BACKPROP, [f"--ckpt_path={tmp}/nothing.ckpt"], "nothing.ckpt: no such file"),
        "truncated checkpoint": (BACKPROP, [f"--ckpt_path={truncated}"], "not a readable checkpoint"),
        "another learner's checkpoint": (QOA, [f"--ckpt_path={ckpt}"], "checkpoint is a Backprop, the config asks"),
        "changed hyperparameter": (
            [*BACKPROP, "--model.optimizer.lr=0.5"],
            [f"--ckpt_path={ckpt}"],
            "optimizer.init_args.lr: checkpoint 0.01, config 0.5",
        ),
        "another stream's checkpoint": (
            BACKPROP,
            [f"--ckpt_path={ckpt}", "--data.stream.seed=3"],
            "data.stream.init_args.seed: checkpoint 0, config 3",
        ),
        "nothing to resume": (BACKPROP, ["--ckpt_path=last"], "no run under"),
        "unknown option": (BACKPROP, ["--trainer.max_epochz=3"], "unrecognized arguments"),
        "invalid learning rate": (BACKPROP, ["--model.optimizer.lr=-1"], "Invalid learning rate"),
    }


def test_bad_inputs_give_one_line_and_exit_2(
    tmp_path: Path, backprop_ckpt: Path, capsys: pytest.CaptureFixture
) -> None:
    cases = _bad_inputs(tmp_path, backprop_ckpt)
    assert len(cases) >= 12
    for name, (learner, extra, fragment) in cases.items():
        run = tmp_path / name.replace(" ", "_").replace("'", "")
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main(["fit", *tiny_args(run, learner, extra=extra)])
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert stop.value.code == 2, name
        assert len(errors) == 1, (name, err)
        assert fragment in errors[0], (name, errors[0])
        assert "Traceback" not in err, (name, err)
        assert "usage:" not in err, (name, err)
        assert "Union subtypes" not in errors[0], (name, errors[0])
        assert not (run / "logs").exists() or not any((run / "logs").rglob("*")), (name, list(run.rglob("*")))


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


def test_help_says_what_the_package_is(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "continual learning from a stream" in out
    assert "--model.help QueryOnlyAttention" in out
