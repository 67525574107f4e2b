"""Effective rank and srank against hand cases and numpy."""

import numpy as np
import pytest
import torch

from cl_lightning.metrics import effective_rank, entropy_effective_rank, srank


def _np_erank(sv: np.ndarray) -> float:
    p = sv / np.abs(sv).sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def _np_cumulative_rank(v: np.ndarray, prop: float) -> int:
    """LoP's loop: add normalised values in descending order until the running share reaches prop."""
    share = np.sort(v / v.sum())[::-1]
    total, k = 0.0, 0
    while total < prop:
        total += share[k]
        k += 1
    return k


@pytest.mark.parametrize("n", [1, 5, 32])
def test_erank_of_identity_is_n(n: int) -> None:
    assert effective_rank(torch.eye(n)).item() == pytest.approx(n)
    assert effective_rank(torch.eye(n, n + 3)).item() == pytest.approx(n)


def test_erank_of_rank_one_is_one() -> None:
    u, v = torch.randn(20, 1), torch.randn(1, 7)
    assert effective_rank(u @ v).item() == pytest.approx(1.0)


def test_erank_matches_numpy() -> None:
    x = torch.randn(50, 12, dtype=torch.float64) @ torch.diag(torch.logspace(0, -3, 12, dtype=torch.float64))
    expected = _np_erank(np.linalg.svd(x.numpy(), compute_uv=False))
    assert effective_rank(x).item() == pytest.approx(expected, rel=1e-12)


def test_entropy_erank_of_spectrum() -> None:
    # p = (0.5, 0.25, 0.25): H = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2 -> erank = 2^1.5
    assert entropy_effective_rank(torch.tensor([2.0, 1.0, 1.0, 0.0])).item() == pytest.approx(2**1.5)
    assert entropy_effective_rank(torch.zeros(4)).item() == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        entropy_effective_rank(torch.tensor([1.0, -1.0]))


@pytest.mark.parametrize("delta", [0.01, 0.1, 0.5])
def test_srank_matches_numpy(delta: float) -> None:
    sv = np.random.default_rng(0).exponential(size=40) ** 3
    assert srank(torch.from_numpy(sv), delta).item() == _np_cumulative_rank(sv, 1 - delta)


def test_srank_hand() -> None:
    # total 11.5, 99% = 11.385: cumulative sums 10, 11, 11.5 -> 3
    assert srank(torch.tensor([1.0, 10.0, 0.5])).item() == 3
    assert srank(torch.ones(100)).item() == 99  # 99 ones reach 0.99 * 100
    assert srank(torch.zeros(3)).item() == 0
