"""Dead / dormant unit fractions and weight magnitude on hand activations and numpy references."""

import numpy as np
import pytest
import torch
from torch import nn

from cl_lightning.metrics import dead_unit_fraction, dormant_unit_fraction, weight_magnitude

# 3 probe inputs x 5 units; units 0 and 3 are zero on every input, unit 4 is zero on all but one
ACTS = torch.tensor(
    [
        [0.0, 1.0, 2.0, 0.0, 0.0],
        [0.0, 3.0, 0.0, 0.0, 0.0],
        [0.0, 2.0, 4.0, 0.0, 0.3],
    ]
)


def test_dead_unit_fraction_hand() -> None:
    assert dead_unit_fraction(ACTS).item() == pytest.approx(2 / 5)


def test_dead_unit_fraction_conv_channels() -> None:
    acts = torch.rand(4, 3, 5, 5)
    acts[:, 1] = 0.0  # channel 1 silent at every position of every input
    acts[0, 2, 0, 0] = 0.0  # channel 2 silent somewhere only: alive
    assert dead_unit_fraction(acts).item() == pytest.approx(1 / 3)


def test_dormant_unit_fraction_hand() -> None:
    # per-unit mean |h| = (0, 2, 2, 0, 0.1); layer mean = 4.1 / 5 = 0.82
    # scores = (0, 2.439, 2.439, 0, 0.122): tau = 0.1 -> 2 dormant; tau = 0.13 -> 3 dormant
    assert dormant_unit_fraction(ACTS, tau=0.1).item() == pytest.approx(2 / 5)
    assert dormant_unit_fraction(ACTS, tau=0.13).item() == pytest.approx(3 / 5)


def test_dormant_with_zero_tau_equals_dead() -> None:
    acts = torch.relu(torch.randn(64, 32) - 1.5)
    assert dormant_unit_fraction(acts, tau=0.0).item() == dead_unit_fraction(acts).item()


def test_dormant_matches_numpy() -> None:
    acts = torch.randn(100, 20) * torch.logspace(-3, 1, 20)
    mean_abs = np.abs(acts.numpy()).mean(axis=0)
    score = mean_abs / mean_abs.mean()
    assert dormant_unit_fraction(acts, tau=0.025).item() == pytest.approx(np.mean(score <= 0.025))


def test_all_zero_layer_is_fully_dormant() -> None:
    assert dormant_unit_fraction(torch.zeros(8, 4), tau=0.1).item() == 1.0
    with pytest.raises(ValueError, match="tau"):
        dormant_unit_fraction(ACTS, tau=-1.0)


def test_weight_magnitude_hand() -> None:
    # |1| + |-3| + |0| + |4| = 8 over 4 entries
    params = [torch.tensor([1.0, -3.0]), torch.tensor([[0.0, 4.0]])]
    assert weight_magnitude(params).item() == pytest.approx(2.0)
    assert weight_magnitude(params, reduction="sum").item() == pytest.approx(8.0)


def test_weight_magnitude_matches_numpy() -> None:
    net = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2))
    flat = np.concatenate([p.detach().numpy().ravel() for p in net.parameters()])
    assert weight_magnitude(net.parameters()).item() == pytest.approx(np.abs(flat).mean(), rel=1e-6)
