"""QOA's opt-in ``torch.compile`` of the training step: the same training as eager within fp32 rounding, and a
checkpoint an eager learner loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cl_lightning.learners import QueryOnlyAttention
from cl_lightning.run.cli import main
from tests.helpers import tiny_args
from tests.test_sync import QOA_WINDOW


@pytest.mark.slow  # inductor compiles the step's forward and backward: about a minute on 2 busy cores
def test_compiled_training_equals_eager_and_its_checkpoint_loads_eagerly(tmp_path: Path) -> None:
    runs = {}
    for compiled in (False, True):
        args = tiny_args(tmp_path / str(compiled), QOA_WINDOW, tasks=2, extra=[f"--model.compile={compiled}"])
        cli = main(args, run=False)
        cli.trainer.fit(cli.model, cli.datamodule)
        runs[compiled] = cli
    eager, compiled = runs[False].model, runs[True].model
    assert compiled._compiled_loss is not None
    assert compiled._compiled_loss.compiled is not None  # it did run compiled
    assert eager._compiled_loss is None
    assert int(compiled.steps_taken) == 32
    weights_e, weights_c = eager.state_dict(), compiled.state_dict()
    assert weights_e.keys() == weights_c.keys()
    assert not any("_orig_mod" in k for k in weights_c)
    for key, value in weights_e.items():
        torch.testing.assert_close(weights_c[key], value, rtol=1e-4, atol=1e-5)  # 22 Adam steps, fp32 rounding
    metrics_e, metrics_c = runs[False].trainer.callback_metrics, runs[True].trainer.callback_metrics
    assert metrics_e.keys() == metrics_c.keys()
    for key, value in metrics_e.items():
        torch.testing.assert_close(metrics_c[key], value, rtol=1e-5, atol=1e-6)

    path = tmp_path / "compiled.ckpt"
    runs[True].trainer.save_checkpoint(path)
    loaded = QueryOnlyAttention.load_from_checkpoint(path, compile=False)
    assert not loaded.compile
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, weights_c[key]), key
    assert loaded._steps == 32
    assert len(loaded.buffer) == len(compiled.buffer)
