"""Plain ``nn.Module`` building blocks (no Lightning, no tasks); the optimisers are in :mod:`cl_lightning.nn.optim`."""

from cl_lightning.nn.gnt import GenerateAndTest
from cl_lightning.nn.mlp import MLP, init_linear
from cl_lightning.nn.optim import AdamGnT
from cl_lightning.nn.scorers import PairScorer
from cl_lightning.nn.transformer import TinyTransformer

__all__ = ["MLP", "AdamGnT", "GenerateAndTest", "PairScorer", "TinyTransformer", "init_linear"]
