import pytest
import torch

from cl_lightning.ops.feature_maps import feature_dim, feature_map, input_width, random_fourier_weights


def test_poly2_kernel_is_the_squared_inner_product():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 7, generator=gen, dtype=torch.float64), torch.randn(5, 7, generator=gen, dtype=torch.float64)
    phi_q, phi_k = feature_map(q, "poly2"), feature_map(k, "poly2")
    assert phi_q.shape[-1] == feature_dim("poly2", 7) == 49
    torch.testing.assert_close((phi_q * phi_k).sum(-1), (q * k).sum(-1) ** 2)


def test_elu1_is_positive_and_identity_is_identity():
    x = torch.linspace(-5, 5, 11)
    assert (feature_map(x, "elu1") > 0).all()
    torch.testing.assert_close(feature_map(x, "elu1")[-1], torch.tensor(6.0))
    assert feature_map(x, "identity") is x


def test_random_fourier_approximates_the_gaussian_kernel():
    gen = torch.Generator().manual_seed(0)
    weights = random_fourier_weights(4, 40_000, gen).double()
    q, k = 0.5 * torch.randn(6, 4, generator=gen, dtype=torch.float64), 0.5 * torch.randn(6, 4, generator=gen).double()
    got = (feature_map(q, "random_fourier", weights) * feature_map(k, "random_fourier", weights)).sum(-1)
    want = torch.exp(-(q - k).pow(2).sum(-1) / 2)
    assert (got - want).abs().max() < 0.02  # Monte Carlo error ~ 1/sqrt(20,000)


def test_widths_and_bad_names_raise():
    assert input_width("poly2", 64) == 8
    assert input_width("elu1", 64) == 64
    with pytest.raises(ValueError, match="perfect square"):
        input_width("poly2", 60)
    with pytest.raises(ValueError, match="even"):
        input_width("random_fourier", 7)
    with pytest.raises(ValueError, match="unknown feature map"):
        feature_map(torch.ones(2), "cubic")  # type: ignore[arg-type]
