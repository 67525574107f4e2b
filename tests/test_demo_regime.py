"""The CPU demo regime shows the paper's headline: QOA keeps what it learned while Backprop forgets.

A shortened run of the README's main command (``quick_demo.yaml`` + ``quick_qoa.yaml``) and of Backprop on the same
stream, fixed seed: QOA's backward accuracy (task t - 5) stays within 0.1 of its forward accuracy over the last
tasks, while Backprop's falls at least 0.2 below its own.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers import CONFIGS
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from cl_lightning.callbacks import CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor
from cl_lightning.run.cli import main

TASKS = 30  # of the demo's 60
LAST = 10


class _PerTask(Callback):
    def __init__(self) -> None:
        self.forward: list[float] = []
        self.backward: list[float] = []

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.forward.append(float(trainer.callback_metrics["eval/forward_acc"]))
        self.backward.append(float(trainer.callback_metrics.get("eval/backward_acc", math.nan)))


def _last_means(config: str, overlays: list[str], tmp_path: Path) -> tuple[float, float]:
    args = ["--config", str(CONFIGS / config)]
    for overlay in overlays:
        args += ["--config", str(CONFIGS / overlay)]
    cli = main(
        [
            *args,
            f"--data.stream.init_args.num_tasks={TASKS}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )
    monitors = (CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor, ModelCheckpoint)
    per_task = _PerTask()
    cli.trainer.callbacks[:] = [c for c in cli.trainer.callbacks if not isinstance(c, monitors)] + [per_task]
    cli.trainer.fit(cli.model, cli.datamodule)
    assert len(per_task.forward) == TASKS
    fwd, bwd = per_task.forward[-LAST:], per_task.backward[-LAST:]
    return sum(fwd) / LAST, sum(bwd) / LAST


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_qoa_keeps_what_it_learned_while_backprop_forgets(tmp_path: Path) -> None:
    qoa_fwd, qoa_bwd = _last_means("qoa_pmnist.yaml", ["quick_demo.yaml", "quick_qoa.yaml"], tmp_path / "qoa")
    bp_fwd, bp_bwd = _last_means("bp_pmnist.yaml", ["quick_demo.yaml"], tmp_path / "bp")
    assert qoa_fwd > 0.3, f"QOA forward {qoa_fwd:.3f} barely above chance"
    assert abs(qoa_fwd - qoa_bwd) <= 0.1, f"QOA forward {qoa_fwd:.3f} vs backward {qoa_bwd:.3f}"
    assert bp_fwd - bp_bwd >= 0.2, f"Backprop forward {bp_fwd:.3f} vs backward {bp_bwd:.3f}"


def test_quick_fa_overlay_on_the_demo_stream(tmp_path: Path) -> None:
    args = ["--config", str(CONFIGS / "full_attention_pmnist.yaml"), "--config", str(CONFIGS / "quick_demo.yaml")]
    cli = main(
        [*args, "--config", str(CONFIGS / "quick_fa.yaml"), f"--trainer.logger.init_args.save_dir={tmp_path}"],
        run=False,
    )
    model = cli.model
    assert len(model.transformer.q) == 2
    assert model.queries_per_step == 16
    assert model.buffer.capacity >= model.support_size + model.queries_per_step  # 99 supports + 16 queries fit
    assert cli.trainer.max_epochs == 60
