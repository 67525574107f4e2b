"""Rank measures of feature matrices and of non-negative spectra.

All spectra are handled in float64. Singular values come from ``torch.linalg.svdvals``; the loss-of-plasticity code
uses SciPy's ``gesvd`` driver on CPU for large matrices, which gives the same values up to round-off.
"""

import torch
from torch import Tensor


def _check_spectrum(values: Tensor) -> Tensor:
    """Returns ``values`` as a float64 vector; raises if any entry is negative."""
    v = torch.as_tensor(values).to(torch.float64).flatten()
    if bool((v < 0).any()):
        raise ValueError("spectrum must be non-negative (pass |eigenvalues| or singular values)")
    return v


def entropy_effective_rank(values: Tensor) -> Tensor:
    """Entropy effective rank of a non-negative spectrum (Roy & Vetterli 2007), a float64 scalar.

    p_k = v_k / Σ_i v_i, H = −Σ_{p_k > 0} p_k ln p_k (0 ln 0 := 0), erank = exp(H) ∈ [1, #nonzero]. Applied to the
    singular values of a matrix this is Roy & Vetterli's effective rank; applied to Hessian eigenvalues it is the
    form used by Lewandowski et al. and the QOA paper. An all-zero spectrum has erank 0.

    Args:
        values: (Q,) non-negative values (singular values or |eigenvalues|).

    >>> round(entropy_effective_rank(torch.tensor([1.0, 1.0, 0.0, 1.0])).item(), 6)
    3.0
    """
    v = _check_spectrum(values)
    total = v.sum()
    if total == 0:
        return torch.zeros((), dtype=torch.float64, device=v.device)
    p = v / total
    p = p[p > 0]
    return torch.exp(-(p * p.log()).sum())


def effective_rank(x: Tensor) -> Tensor:
    """Effective rank of a matrix (Roy & Vetterli 2007): entropy effective rank of its singular values, a float64
    scalar in [1, min(N, D)] (0 for the zero matrix).

    Args:
        x: (N, D) matrix, e.g. activations of N probe inputs on D units.

    >>> round(effective_rank(torch.eye(4)).item(), 6)
    4.0
    """
    assert x.ndim == 2, f"expected (N, D), got {tuple(x.shape)}"
    return entropy_effective_rank(torch.linalg.svdvals(x.to(torch.float64)))


def srank(values: Tensor, delta: float = 0.01) -> Tensor:
    """srank_δ (Kumar et al. 2021, "Implicit Under-Parameterization"), on unsquared values, an int64 scalar.

    srank_δ = min{k : Σ_{i≤k} σ_(i) ≥ (1 − δ) Σ_i σ_i} with σ sorted in descending order. This equals the LoP
    code's ``abs_approximate_rank`` and its CIFAR "stable rank". For a Hessian pass |λ|.

    Args:
        values: (Q,) non-negative values (singular values or |eigenvalues|).
        delta: fraction of the total mass that may be left out.

    >>> srank(torch.tensor([10.0, 1.0, 0.5])).item()
    3
    """
    v = _check_spectrum(values)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    total = v.sum()
    if total == 0:  # an all-zero spectrum
        return torch.zeros((), dtype=torch.int64, device=v.device)
    cum = torch.sort(v, descending=True).values.cumsum(0)
    return (cum < (1.0 - delta) * total).sum() + 1
