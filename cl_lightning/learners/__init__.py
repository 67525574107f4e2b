"""Learners: one LightningModule per method, selected by ``class_path``."""

from cl_lightning.learners.backprop import Backprop
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.learners.continual_backprop import ContinualBackprop
from cl_lightning.learners.ewc import EWC
from cl_lightning.learners.full_attention import FullAttention
from cl_lightning.learners.knn import KNN
from cl_lightning.learners.maml_replay import MAMLReplay
from cl_lightning.learners.parametric_attention import ParametricAttention
from cl_lightning.learners.query_only_attention import QueryOnlyAttention
from cl_lightning.learners.replay import ReplayLearner
from cl_lightning.learners.stable_key_memory import StableKeyMemory

__all__ = [
    "EWC",
    "KNN",
    "Backprop",
    "ContinualBackprop",
    "ContinualLearner",
    "FullAttention",
    "MAMLReplay",
    "ParametricAttention",
    "QueryOnlyAttention",
    "ReplayLearner",
    "StableKeyMemory",
]
