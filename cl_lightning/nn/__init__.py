"""Plain ``nn.Module`` building blocks (no Lightning, no tasks, no optimisers)."""

from cl_lightning.nn.mlp import MLP, init_linear
from cl_lightning.nn.scorers import PairScorer

__all__ = ["MLP", "PairScorer", "init_linear"]
