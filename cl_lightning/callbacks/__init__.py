"""Lightning callbacks that observe a run and log what they see."""

from cl_lightning.callbacks.cost import CostMonitor
from cl_lightning.callbacks.forgetting import ForgettingMonitor
from cl_lightning.callbacks.hessian import HessianMonitor
from cl_lightning.callbacks.key_coherence import KeyCoherenceMonitor
from cl_lightning.callbacks.plasticity import PlasticityMonitor
from cl_lightning.callbacks.progress import TaskProgressBar
from cl_lightning.callbacks.rule_reference import RuleReferenceMonitor

__all__ = [
    "CostMonitor",
    "ForgettingMonitor",
    "HessianMonitor",
    "KeyCoherenceMonitor",
    "PlasticityMonitor",
    "RuleReferenceMonitor",
    "TaskProgressBar",
]
