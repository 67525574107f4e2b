"""Dead and dormant units, and weight magnitude.

Activations are ``(N, U)`` for N probe inputs and U units, or ``(N, C, *spatial)`` for convolutional layers, where a
unit is a channel and statistics pool over inputs and spatial positions.
"""

from collections.abc import Iterable
from typing import Literal

import torch
from torch import Tensor


def _per_unit_mean_abs(acts: Tensor) -> Tensor:
    """(U,) mean |activation| of each unit over inputs (and spatial positions)."""
    assert acts.ndim >= 2, f"expected (N, U) or (N, C, *spatial), got {tuple(acts.shape)}"
    dims = [0, *range(2, acts.ndim)]
    return acts.abs().to(torch.float64).mean(dim=dims)


def dead_unit_fraction(acts: Tensor) -> Tensor:
    """Fraction of units whose output is exactly zero on every probe input, a float64 scalar in [0, 1].

    The loss-of-plasticity Permuted-MNIST definition (Dohare et al. 2024): unit u is dead when Σ_n |h_u(x_n)| = 0.

    Args:
        acts: (N, U) or (N, C, *spatial) activations on a fixed probe batch.

    >>> dead_unit_fraction(torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])).item()
    0.5
    """
    return (_per_unit_mean_abs(acts) == 0).to(torch.float64).mean()


def dormant_unit_fraction(acts: Tensor, tau: float = 0.0) -> Tensor:
    """Fraction of τ-dormant units (Sokar et al. 2023, "The Dormant Neuron Phenomenon in Deep RL"), in [0, 1].

    s_u = E_x|h_u(x)| / ((1/U) Σ_k E_x|h_k(x)|); unit u is τ-dormant when s_u ≤ τ (Sokar's inequality is
    non-strict, so τ = 0 counts exactly the dead units). A layer with all-zero activations is fully dormant.

    Args:
        acts: (N, U) or (N, C, *spatial) activations on a fixed probe batch.
        tau: dormancy threshold on the normalised score (Sokar et al. use 0 to 0.1).

    >>> dormant_unit_fraction(torch.tensor([[0.1, 1.0, 3.0, 0.0], [0.1, 1.0, 3.0, 0.0]]), tau=0.1).item()
    0.5
    """
    if tau < 0:
        raise ValueError(f"tau must be non-negative, got {tau}")
    mean_abs = _per_unit_mean_abs(acts)
    score = mean_abs / mean_abs.mean().clamp_min(torch.finfo(torch.float64).tiny)
    return (score <= tau).to(torch.float64).mean()


def weight_magnitude(params: Iterable[Tensor], reduction: Literal["mean", "sum"] = "mean") -> Tensor:
    """Average (or total) absolute parameter value, a float64 scalar.

    ``mean``: Σ|p| / #p over all given tensors (LoP's incremental-CIFAR form; pass only the weight matrices for the
    Permuted-MNIST form, which is Σ|W| over the Linear weights divided by their count). ``sum``: Σ|p|.

    Args:
        params: tensors to pool, e.g. ``model.parameters()``.
        reduction: ``"mean"`` or ``"sum"``.

    >>> weight_magnitude([torch.tensor([1.0, -3.0]), torch.tensor([[0.0, 4.0]])]).item()
    2.0
    """
    total = torch.zeros((), dtype=torch.float64)
    count = 0
    for p in params:
        total = total + p.detach().abs().to(torch.float64).sum().cpu()
        count += p.numel()
    if reduction == "sum":
        return total
    if count == 0:
        raise ValueError("weight_magnitude needs at least one parameter element")
    return total / count
