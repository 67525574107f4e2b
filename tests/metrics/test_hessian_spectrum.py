"""Exact Hessian, HVPs, Lanczos top-k and Hessian ranks against autograd, finite differences and numpy."""

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.nn.functional import cross_entropy

from cl_lightning import metrics

LossFn = Callable[[Tensor], Tensor]


@pytest.fixture(scope="module")
def mlp_loss(make_mlp_loss) -> tuple[nn.Module, LossFn, Tensor, Tensor]:
    """A 5-12-8-3 tanh MLP (203 parameters, float64) with cross-entropy on a fixed batch of 32."""
    net, loss_fn, theta = make_mlp_loss((5, 12, 8, 3), 32)
    h_ref = torch.autograd.functional.hessian(loss_fn, theta)  # reverse-over-reverse reference
    return net, loss_fn, theta, h_ref


def test_flat_loss_equals_module_loss(mlp_loss: tuple) -> None:
    net, loss_fn, theta, _ = mlp_loss
    assert theta.numel() == 203
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (32,), generator=gen)
    torch.testing.assert_close(loss_fn(theta), cross_entropy(net(x), y))


def test_exact_hessian_matches_autograd(mlp_loss: tuple) -> None:
    _, loss_fn, theta, h_ref = mlp_loss
    h = metrics.exact_hessian(loss_fn, theta)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(
        metrics.hvp_hessian(metrics.make_hvp(loss_fn, theta), theta.numel(), chunk_size=64), h_ref
    )


def test_exact_eigvals_match_numpy(mlp_loss: tuple) -> None:
    _, loss_fn, theta, h_ref = mlp_loss
    expected = np.linalg.eigvalsh(h_ref.numpy())  # ascending
    got = metrics.exact_eigvals(metrics.make_hvp(loss_fn, theta), theta.numel(), which="SA")
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-12)
    by_magnitude = metrics.exact_eigvals(metrics.make_hvp(loss_fn, theta), theta.numel(), k=5)
    np.testing.assert_allclose(by_magnitude.numpy(), expected[np.argsort(-np.abs(expected))[:5]], rtol=1e-9)


def test_hvp_matches_finite_differences(mlp_loss: tuple) -> None:
    _, loss_fn, theta, _ = mlp_loss
    v = torch.randn(theta.numel(), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grad = torch.func.grad(loss_fn)
    eps = 1e-5
    central = (grad(theta + eps * v) - grad(theta - eps * v)) / (2 * eps)  # O(eps^2) accurate
    torch.testing.assert_close(metrics.make_hvp(loss_fn, theta)(v), central, rtol=1e-6, atol=1e-9)


def test_block_hessian_is_sub_block_of_full(mlp_loss: tuple) -> None:
    net, _, _theta, h_ref = mlp_loss
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (32,), generator=gen)
    block_fn, block = metrics.flat_loss(net, cross_entropy, x, y, param_names=["4.weight", "4.bias"])
    assert block.numel() == 27  # the output layer, as in the QOA paper's final-layer Hessian
    torch.testing.assert_close(metrics.exact_hessian(block_fn, block), h_ref[-27:, -27:])
    with pytest.raises(ValueError, match="unknown"):
        metrics.flat_loss(net, cross_entropy, x, y, param_names=["nope"])


@pytest.mark.parametrize("which", ["LM", "LA", "SA"])
def test_lanczos_top_k_matches_eigvalsh(mlp_loss: tuple, which: str) -> None:
    _, loss_fn, theta, h_ref = mlp_loss
    expected = np.linalg.eigvalsh(h_ref.numpy())
    key = {"LM": -np.abs(expected), "LA": -expected, "SA": expected}[which]
    top = expected[np.argsort(key, kind="stable")[:6]]
    got = metrics.lanczos_eigvals(metrics.make_hvp(loss_fn, theta), theta.numel(), k=6, which=which)
    np.testing.assert_allclose(got.numpy(), top, rtol=1e-6)
    np.testing.assert_allclose(
        metrics.exact_eigvals(metrics.make_hvp(loss_fn, theta), theta.numel(), 6, which).numpy(), top, rtol=1e-9
    )


def test_lanczos_bad_k_raises() -> None:
    hvp = metrics.make_hvp(lambda t: (t**2).sum(), torch.zeros(4))
    with pytest.raises(ValueError, match="0 < k < n"):
        metrics.lanczos_eigvals(hvp, 4, k=4)


def test_hessian_effective_rank_as_qoa_code(mlp_loss: tuple) -> None:
    _, loss_fn, theta, h_ref = mlp_loss
    # the QOA recipe in numpy: eig(H + 1e-6 I), clip to >= 1e-12, p = lam / sum, exp(entropy)
    lam = np.clip(np.linalg.eigvalsh(h_ref.numpy() + 1e-6 * np.eye(theta.numel())), 1e-12, None)
    p = lam / lam.sum()
    expected = np.exp(-(p * np.log(p)).sum())
    eig = metrics.exact_eigvals(metrics.make_hvp(loss_fn, theta), theta.numel())
    assert metrics.hessian_effective_rank(eig).item() == pytest.approx(expected, rel=1e-8)


def test_hessian_effective_rank_hand() -> None:
    # |lambda| convention: (2, 2, 1, 1) -> p = (1/3, 1/3, 1/6, 1/6); erank = exp(2/3 ln 3 + 1/3 ln 6)
    eig = torch.tensor([2.0, -2.0, 1.0, -1.0])
    expected = np.exp(2 / 3 * np.log(3) + 1 / 3 * np.log(6))
    assert metrics.hessian_effective_rank(eig, jitter=0.0, clamp=None).item() == pytest.approx(expected)
    # paper convention discards the negative half: (2, 1) + tiny clamps -> exp(2/3 ln 1.5 + 1/3 ln 3)
    expected_clamped = np.exp(2 / 3 * np.log(1.5) + 1 / 3 * np.log(3))
    assert metrics.hessian_effective_rank(eig).item() == pytest.approx(expected_clamped, rel=1e-5)
    assert metrics.hessian_spectrum(eig, jitter=0.0).tolist() == [2.0, 1e-12, 1.0, 1e-12]


def test_hessian_srank_matches_numpy(mlp_loss: tuple) -> None:
    _, _, _, h_ref = mlp_loss
    mag = np.sort(np.abs(np.linalg.eigvalsh(h_ref.numpy())))[::-1]
    expected = int(np.searchsorted(np.cumsum(mag), 0.99 * mag.sum()) + 1)
    assert metrics.hessian_srank(torch.linalg.eigvalsh(h_ref)).item() == expected
