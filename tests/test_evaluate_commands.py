"""``validate`` and ``test`` on a fitted run's checkpoint: what they score, under names that say so (issue 48)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import BACKPROP, fit, tiny_args

from cl_lightning.run.cli import main

MONITOR = ["--trainer.callbacks+=cl_lightning.callbacks.ForgettingMonitor", "--trainer.callbacks.plot=false"]
KEEP = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_last=true"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """A 4-task Backprop run (probe tasks 0, 1, 3 ... as the data module picks them) and its logged metrics."""
    root = tmp_path_factory.mktemp("fit")
    cli = fit(root, BACKPROP, tasks=4, extra=[*MONITOR, *KEEP, f"--trainer.callbacks.dirpath={root}/ckpt"])
    return root / "ckpt" / "last.ckpt", {k: float(v) for k, v in cli.trainer.callback_metrics.items()}


@pytest.mark.parametrize("command", ["validate", "test"])
def test_an_evaluation_scores_the_final_row_under_its_own_names(
    command: str, fitted: tuple[Path, dict[str, float]], tmp_path: Path
) -> None:
    """Both commands score the checkpoint on every probe task: the fit's last row of R, task by task, and its mean
    (the final model's ACC) under `<command>/acc`; nothing under a fit's name for another quantity (`eval/forward_acc`
    was task 0's score under the last task's name, `forgetting/avg` row 0's ACC)."""
    ckpt, logged = fitted
    cli = main(tiny_args(tmp_path, BACKPROP, tasks=4, extra=MONITOR), run=False)
    (out,) = getattr(cli.trainer, command)(cli.model, cli.datamodule, ckpt_path=str(ckpt))
    probes = cli.datamodule.probe_tasks
    assert probes == [0, 2, 3]
    prefix = "validate" if command == "validate" else "test"
    row = [out[f"{prefix}/acc/task_{j}"] for j in probes]
    assert row == pytest.approx([logged[f"eval/acc_matrix/task_{j}"] for j in probes], abs=1e-6)
    assert out[f"{prefix}/acc"] == pytest.approx(sum(row) / len(row), abs=1e-6)
    assert out[f"{prefix}/acc"] == pytest.approx(logged["forgetting/avg"], abs=1e-6)  # the fit's final ACC
    assert set(out) == {f"{prefix}/acc", *(f"{prefix}/acc/task_{j}" for j in probes)}
    assert torch.isfinite(torch.tensor(row)).all()
