"""Stochastic Lanczos quadrature: exactness on small matrices, moments and the effective-rank estimate."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.functional import cross_entropy

from cl_lightning.metrics import (
    exact_eigvals,
    flat_loss,
    hessian_effective_rank,
    make_hvp,
    slq_effective_rank,
    slq_spectral_density,
)


def test_full_lanczos_nodes_are_the_eigenvalues() -> None:
    # with num_steps = n every probe's Krylov space is the whole space (distinct eigenvalues), so its
    # Gauss nodes are exactly the eigenvalues and its weights sum to 1
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 8, generator=gen, dtype=torch.float64)
    a = a + a.T
    nodes, weights = slq_spectral_density(lambda v: a @ v, 8, num_probes=3, num_steps=8)
    expected = torch.linalg.eigvalsh(a)
    for probe in range(3):
        torch.testing.assert_close(nodes[probe * 8 : (probe + 1) * 8], expected)
    torch.testing.assert_close(weights.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_closed_krylov_space_restarts_with_zero_weight() -> None:
    # H = diag(1, 1, 1, 4, 4): a Rademacher probe sees weight |P_1 z|^2 / n = 3/5 at 1 and 2/5 at 4, exactly;
    # the Krylov space closes after 2 steps and the restart nodes must carry no weight
    d = torch.tensor([1.0, 1.0, 1.0, 4.0, 4.0], dtype=torch.float64)
    nodes, weights = slq_spectral_density(lambda v: d * v, 5, num_probes=4, num_steps=5)
    assert torch.isfinite(nodes).all()
    at_one, at_four = (nodes - 1).abs() < 1e-8, (nodes - 4).abs() < 1e-8
    assert weights[at_one].sum().item() == pytest.approx(0.6, abs=1e-10)
    assert weights[at_four].sum().item() == pytest.approx(0.4, abs=1e-10)
    assert weights[~(at_one | at_four)].sum().item() == pytest.approx(0.0, abs=1e-10)


def test_diagonal_first_moment_is_exact() -> None:
    # for diagonal H, z^T H z = tr(H) for every +-1 vector: the first moment equals tr(H)/n exactly
    d = torch.linspace(-1.0, 3.0, 50, dtype=torch.float64)
    nodes, weights = slq_spectral_density(lambda v: d * v, 50, num_probes=4, num_steps=10)
    assert (weights >= 0).all()
    assert weights.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert (weights * nodes).sum().item() == pytest.approx(d.mean().item(), abs=1e-12)


@pytest.fixture(scope="module")
def mlp_hvp(make_mlp_loss) -> tuple:
    """A 6-16-12-3 tanh MLP (355 parameters, float64), cross-entropy on 64 points; HVP and exact eigenvalues."""
    _, loss_fn, theta = make_mlp_loss((6, 16, 12, 3), 64)
    hvp = make_hvp(loss_fn, theta)
    return hvp, theta.numel(), exact_eigvals(hvp, theta.numel()), torch.func.hessian(loss_fn)(theta)


def test_mlp_density_moments(mlp_hvp: tuple) -> None:
    hvp, n, _, h = mlp_hvp
    num_probes = 16
    nodes, weights = slq_spectral_density(hvp, n, num_probes=num_probes, num_steps=30)
    assert weights.sum().item() == pytest.approx(1.0, abs=1e-12)
    # the first moment is a Hutchinson estimate of tr(H)/n; Rademacher variance is 2 sum_{i != j} H_ij^2 per probe
    off = h - torch.diag(torch.diag(h))
    std = (2 * off.square().sum() / num_probes).sqrt().item() / n
    assert abs((weights * nodes).sum().item() - torch.trace(h).item() / n) < 3 * std


def test_chunked_probes_match(mlp_hvp: tuple) -> None:
    hvp, n, _, _ = mlp_hvp
    nodes, weights = slq_spectral_density(hvp, n, num_probes=6, num_steps=20)
    nodes_c, weights_c = slq_spectral_density(hvp, n, num_probes=6, num_steps=20, chunk_size=4)
    torch.testing.assert_close(nodes_c, nodes)
    torch.testing.assert_close(weights_c, weights)


@pytest.fixture(scope="module")
def mlp_density(mlp_hvp: tuple) -> tuple:
    hvp, n, _, _ = mlp_hvp
    return slq_spectral_density(hvp, n, num_probes=32, num_steps=60, seed=0)


@pytest.mark.parametrize("convention", [{}, {"jitter": 0.0, "clamp": None}], ids=["qoa-clamp", "abs"])
def test_slq_effective_rank_close_to_exact(mlp_hvp: tuple, mlp_density: tuple, convention: dict) -> None:
    # Stated tolerance 10% relative. 32 probes x 60 Lanczos steps on P = 355 at init (half the spectrum negative):
    # over seeds 0-7 the error was -0.4% to +8.3% (clamped) and +3% to +8% (|lambda|); the positive bias is Gauss
    # quadrature of the kink of s(lambda) at 0 (see the full-Lanczos test below)
    _, n, eig, _ = mlp_hvp
    estimate = slq_effective_rank(*mlp_density, n, **convention).item()
    assert estimate == pytest.approx(hessian_effective_rank(eig, **convention).item(), rel=0.10)


@pytest.mark.parametrize("convention", [{}, {"jitter": 0.0, "clamp": None}], ids=["qoa-clamp", "abs"])
def test_full_lanczos_effective_rank_only_has_probe_error(convention: dict) -> None:
    # Stated tolerance 8% relative. num_steps = P makes each probe's quadrature exact, leaving Hutchinson error:
    # on this P = 93 net over seeds 0-15 the error was within 6.1% (clamped) and 3.1% (|lambda|), with no bias
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 10), nn.Tanh(), nn.Linear(10, 3)).double()
    x = torch.randn(32, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (32,), generator=gen)
    loss_fn, theta = flat_loss(net, cross_entropy, x, y)
    hvp, n = make_hvp(loss_fn, theta), theta.numel()
    nodes, weights = slq_spectral_density(hvp, n, num_probes=32, num_steps=n, seed=0)
    exact = hessian_effective_rank(exact_eigvals(hvp, n), **convention).item()
    assert slq_effective_rank(nodes, weights, n, **convention).item() == pytest.approx(exact, rel=0.08)


def test_slq_effective_rank_of_exact_spectrum_is_exact() -> None:
    # point masses at the true eigenvalues (weight 1/n each) reproduce the exact entropy effective rank
    eig = torch.from_numpy(np.random.default_rng(0).normal(size=30))
    estimate = slq_effective_rank(eig, torch.full((30,), 1 / 30, dtype=torch.float64), 30)
    assert estimate.item() == pytest.approx(hessian_effective_rank(eig).item(), rel=1e-10)
