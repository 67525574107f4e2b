"""The utility measures of generate-and-test (:class:`~cl_lightning.nn.gnt.GenerateAndTest`, step 3).

How much a hidden unit contributes, from its post-activation features ``h (B, H)``, their running mean ĥ and the mean
magnitudes of its outgoing (``out_mag``) and incoming (``in_mag``) weights, all ``(H,)``: ``contribution`` (Eq. 1 of
the Nature paper up to a per-layer constant) or ``adaptable_contribution`` (the MNIST default of the reference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

UtilityType = Literal["contribution", "adaptable_contribution"]


def batch_mean(x: Tensor) -> Tensor:
    """``x.mean(0)``, bit for bit: ``(B, ...) -> (...)``. One row (a one-point step) on the CPU in float32 / float64
    is summed instead, at half the cost: there torch's mean is the sum divided by the count (``mean_out``), and a
    division by 1 is exact."""
    if x.shape[0] == 1 and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return x.sum(0)
    return x.mean(0)


def contribution(h: Tensor, h_hat: Tensor, out_mag: Tensor, in_mag: Tensor) -> Tensor:
    """``out_mag · mean_batch|h|`` per unit: ``h (B, H)``, the rest ``(H,)``."""
    return out_mag * batch_mean(h.abs())


def adaptable_contribution(h: Tensor, h_hat: Tensor, out_mag: Tensor, in_mag: Tensor) -> Tensor:
    """``out_mag · mean_batch|h − ĥ| / in_mag`` per unit: ``h (B, H)``, the rest ``(H,)``."""
    return out_mag * batch_mean((h - h_hat).abs()) / in_mag


UTILITIES: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]] = {
    "contribution": contribution,
    "adaptable_contribution": adaptable_contribution,
}
