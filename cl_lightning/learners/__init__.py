"""Learners: one LightningModule per method, selected by ``class_path``."""

from cl_lightning.learners.backprop import Backprop
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.learners.query_only_attention import QueryOnlyAttention

__all__ = ["Backprop", "ContinualLearner", "QueryOnlyAttention"]
