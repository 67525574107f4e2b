from __future__ import annotations

from pathlib import Path

import pytest
from helpers import CONFIGS

from cl_lightning.learners import ParametricAttention
from cl_lightning.nn.fast_weights import DeltaRule, OmegaRule
from cl_lightning.run.cli import main

BASE = CONFIGS / "lifelong" / "recall_delta_rule.yaml"
OVERLAYS = sorted(p for p in (CONFIGS / "lifelong").glob("*.yaml") if p != BASE)


def _cli(tmp_path: Path, *configs: Path, extra: list[str] | None = None):
    args = [a for c in configs for a in ("--config", str(c))]
    return main([*args, f"--trainer.logger.init_args.save_dir={tmp_path}", *(extra or [])], run=False)


@pytest.mark.parametrize("overlay", [None, *OVERLAYS], ids=lambda p: "base" if p is None else p.stem)
def test_lifelong_configs_instantiate_and_keep_the_state_small(overlay: Path | None, tmp_path: Path) -> None:
    cli = _cli(tmp_path, BASE, *([overlay] if overlay else []))
    model = cli.model
    assert isinstance(model, ParametricAttention)
    assert cli.trainer.max_epochs == cli.datamodule.num_tasks == 100
    assert model.input_shape == (128,)
    assert 4_700 <= model.context_memory_bytes() <= 5_400  # every lever at about the same state bytes
    if overlay is not None:
        assert model.hparams != _cli(tmp_path, BASE).model.hparams  # the overlay changes something


@pytest.mark.parametrize("overlay", ["omega.yaml", "frozen_encoder.yaml"])
def test_overlays_apply_to_the_pmnist_config(overlay: str, tmp_path: Path) -> None:
    cli = _cli(tmp_path, CONFIGS / "delta_rule_pmnist.yaml", CONFIGS / "lifelong" / overlay)
    assert cli.model.rule == (OmegaRule(window=4) if overlay == "omega.yaml" else DeltaRule())
    assert cli.model.encoder_training == ("frozen_random" if overlay == "frozen_encoder.yaml" else "online")


@pytest.mark.slow
def test_recall_config_remembers_a_task_five_back(tmp_path: Path) -> None:
    # 12 tasks of the base config: live recall of task t - 5 from the 5,120-byte state is well above chance (0.10).
    cli = _cli(tmp_path, BASE, extra=["--data.stream.init_args.num_tasks=12", "--trainer.max_epochs=12"])
    cli.trainer.fit(cli.model, cli.datamodule)
    m = cli.trainer.callback_metrics
    assert m["eval/forward_live_acc"] > 0.9
    assert m["eval/backward_live_acc"] > 0.25
