"""Non-linear feature maps phi for keys and queries: the memory stores phi(k) -> v and reads phi(q).

A linear memory S in R^{D_phi x V} holds at most D_phi linearly independent associations; a feature map raises that
bound (Atlas, Behrouz et al. 2025, arXiv:2505.23735: a degree-p polynomial map takes it from O(d_k) to O(d_k^p)).
The read-out score phi(q)^T phi(k) is then a kernel of q and k:

- ``"identity"``: phi(x) = x (linear kernel q^T k).
- ``"elu1"``: phi(x) = elu(x) + 1 > 0 (Katharopoulos et al. 2020, linear transformers).
- ``"poly2"``: phi(x) = x (x) x flattened, D^2 features, so phi(q)^T phi(k) = (q^T k)^2 exactly.
- ``"random_fourier"``: phi(x) = [cos(x W), sin(x W)] / sqrt(m) with W in R^{D x m} fixed N(0, 1) entries
  (Rahimi & Recht 2007), 2m features, E[phi(q)^T phi(k)] = exp(-||q - k||^2 / 2).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

FeatureMapName = Literal["identity", "elu1", "poly2", "random_fourier"]


def feature_dim(name: FeatureMapName, input_dim: int) -> int:
    """Width D_phi of phi(x) for x of width ``input_dim`` (random_fourier: ``input_dim`` = 2m, see ``input_width``)."""
    return input_dim**2 if name == "poly2" else input_dim


def input_width(name: FeatureMapName, state_dim: int) -> int:
    """The key width D that gives a state of ``state_dim`` rows: sqrt for poly2, the same otherwise.

    Raises:
        ValueError: If poly2 needs a perfect square, or random_fourier an even width.
    """
    if name == "poly2":
        root = round(state_dim**0.5)
        if root * root != state_dim:
            raise ValueError(f"feature_map='poly2' needs key_dim a perfect square (D^2 features), got {state_dim}")
        return root
    if name == "random_fourier" and state_dim % 2:
        raise ValueError(f"feature_map='random_fourier' needs an even key_dim (cos and sin halves), got {state_dim}")
    return state_dim


def random_fourier_weights(input_dim: int, state_dim: int, generator: torch.Generator | None = None) -> Tensor:
    """The fixed projection W (input_dim, state_dim / 2) of ``"random_fourier"``, N(0, 1) entries."""
    return torch.randn(input_dim, state_dim // 2, generator=generator)


def feature_map(x: Tensor, name: FeatureMapName, weights: Tensor | None = None) -> Tensor:
    """phi(x) over the last dim, ``(..., D) -> (..., D_phi)``: the map ``name`` (the module docstring), ``weights``
    the fixed projection (D, m) of ``"random_fourier"``.

    Example:
        >>> q, k = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])
        >>> feature_map(q, "poly2") @ feature_map(k, "poly2"), (q @ k) ** 2
        (tensor(1.), tensor(1.))
    """
    if name == "identity":
        return x
    if name == "elu1":
        return torch.nn.functional.elu(x) + 1.0
    if name == "poly2":
        return (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
    if name == "random_fourier":
        if weights is None:
            raise ValueError("feature_map='random_fourier' needs its fixed projection weights")
        proj = x @ weights.to(x.dtype)
        return torch.cat([proj.cos(), proj.sin()], dim=-1) / weights.shape[-1] ** 0.5
    raise ValueError(f"unknown feature map {name!r}; choose identity, elu1, poly2 or random_fourier")
