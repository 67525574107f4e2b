"""The convolutional feature extractor shared by every learner on Split Tiny ImageNet (docs/qoa.md §3).

Conv(3→32, k5, pad 1) → ReLU → MaxPool2 → Conv(32→64, k3, pad 1) → ReLU → MaxPool2 → Conv(64→128, k3, pad 1)
→ ReLU → MaxPool2 → flatten: 32×32 inputs give 128·3·3 = 1,152 features. PyTorch's default conv init (the paper
applies Xavier to linear layers only); trained end to end from scratch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class SharedCNN(nn.Module):
    """The paper's 3-layer CNN encoder.

    Args:
        in_channels: Image channels (3 for Tiny ImageNet, 1 for MNIST).
        image_size: Side of the square input images (32 in the paper).
    """

    def __init__(self, in_channels: int = 3, image_size: int = 32) -> None:
        super().__init__()
        self.in_channels, self.image_size = in_channels, image_size
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        with torch.no_grad():
            self.out_features = self.layers(torch.zeros(1, in_channels, image_size, image_size)).numel()

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` or ``(B, C·H·W)`` → ``(B, out_features)``."""
        x = x.view(x.shape[0], self.in_channels, self.image_size, self.image_size)
        return self.layers(x).flatten(1)


def make_encoder(kind: str, input_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    """``("flatten" | "cnn", input shape) -> (encoder, features)``; images are ``(C, H, W)`` for the CNN."""
    if kind == "flatten":
        return nn.Flatten(), math.prod(input_shape)
    if kind == "cnn":
        if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
            raise ValueError(f"encoder 'cnn' needs square (C, H, W) images, the stream gives {input_shape}")
        cnn = SharedCNN(input_shape[0], input_shape[1])
        return cnn, cnn.out_features
    raise ValueError(f"encoder must be 'flatten' or 'cnn', got {kind!r}")
