from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import CBP, assert_checkpoint_round_trip, assert_resume_equals_uninterrupted, fit

from cl_lightning.learners import ContinualBackprop
from cl_lightning.nn import AdamGnT

pytestmark = pytest.mark.usefixtures("one_thread")


# replacement 0.05 × 32 units and maturity 5: a 48-step tiny run replaces dozens of units


def test_features_are_the_networks_hidden_activations() -> None:
    model = ContinualBackprop(input_shape=(8,), num_outputs=4, hidden_sizes=[16, 12])
    x = torch.rand(5, 8)
    out, features = model.predict_with_features(x)
    torch.testing.assert_close(out, model.predict(x))
    assert [f.shape for f in features] == [(5, 16), (5, 12)]
    torch.testing.assert_close(features[0], model.net.layers[0](x).relu())


def test_default_optimizer_is_adam_gnt_and_torch_adam_is_refused() -> None:
    model = ContinualBackprop(input_shape=(8,), num_outputs=4, hidden_sizes=[16])
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, AdamGnT)
    assert optimizer.defaults["lr"] == 1e-4
    model = ContinualBackprop(input_shape=(8,), num_outputs=4, hidden_sizes=[16], optimizer=torch.optim.Adam)
    with pytest.raises(ValueError, match="AdamGnT"):
        model.configure_optimizers()
    with pytest.raises(ValueError, match="hidden layer"):
        ContinualBackprop(input_shape=(8,), num_outputs=4, hidden_sizes=[])


def test_cbp_learns_and_replaces_units_on_a_tiny_stream(tmp_path: Path) -> None:
    cli = fit(tmp_path, CBP)
    m = cli.trainer.callback_metrics
    assert torch.isfinite(m["train/loss"])
    assert m["eval/forward_acc"] > 0.25 + 0.2  # 4 classes
    gnt = cli.model.gnt
    # 48 steps; ≈ 0.05 × 32 × (48 − 5) ≈ 69 per layer, less while replaced units mature
    replaced = [int(gnt.buffer("replaced", i)) for i in range(2)]
    assert all(50 <= r <= 69 for r in replaced), replaced
    assert m["train/replaced_units"] == sum(replaced)
    assert int(gnt.buffer("age", 0).max()) == 48  # one generate-and-test step per optimiser step
    steps = cli.trainer.optimizers[0].state[cli.model.net.layers[0].weight]["element_step"]
    assert steps.min() < steps.max() == 48  # replaced rows restarted their Adam step counts


def test_checkpoint_keeps_utilities_ages_and_adam_gnt_steps(tmp_path: Path) -> None:
    assert_checkpoint_round_trip(tmp_path, CBP, ContinualBackprop)
    ckpt = torch.load(next((tmp_path / "ckpt").glob("*.ckpt")), weights_only=False)
    assert {"gnt.util_0", "gnt.age_1", "gnt.mean_act_0", "gnt.to_replace_1"} <= ckpt["state_dict"].keys()
    steps = [s["element_step"] for s in ckpt["optimizer_states"][0]["state"].values()]
    assert steps[0].max() == 48
    assert steps[0].min() < 48


def test_resumed_run_equals_uninterrupted(tmp_path: Path) -> None:
    assert_resume_equals_uninterrupted(tmp_path, CBP)
