"""A plain multi-layer perceptron with the initialisations the papers use."""

from __future__ import annotations

import itertools
from typing import Literal

from torch import Tensor, nn

InitName = Literal["kaiming", "xavier", "default"]


def init_linear(layer: nn.Linear, init: InitName) -> None:
    """Initialise one linear layer.

    ``"kaiming"``: Kaiming-uniform for ReLU with zero bias (the BP/CBP code of the QOA paper, after Dohare et al.);
    ``"xavier"``: Xavier-uniform with zero bias (the QOA scorer and the paper's tables); ``"default"``: PyTorch's.
    """
    if init == "kaiming":
        nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")
        nn.init.zeros_(layer.bias)
    elif init == "xavier":
        nn.init.xavier_uniform_(layer.weight)
        nn.init.zeros_(layer.bias)


class MLP(nn.Module):
    """``in → hidden[0] → … → hidden[-1] → out`` with ReLU between layers and a linear output.

    Args:
        in_features: Input width.
        out_features: Output width.
        hidden_sizes: Widths of the hidden layers (the QOA paper's BP: four of 200).
        init: Weight initialisation (see :func:`init_linear`).
    """

    def __init__(
        self, in_features: int, out_features: int, hidden_sizes: list[int], init: InitName = "kaiming"
    ) -> None:
        super().__init__()
        widths = [in_features, *hidden_sizes, out_features]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        for layer in self.layers:
            init_linear(layer, init)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in_features) -> (..., out_features)``."""
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return self.layers[-1](x)
