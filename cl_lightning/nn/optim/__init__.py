"""Optimisers: every Adam the package runs, in one place: :class:`AdamGnT` (``adam_gnt.py``, whose state
generate-and-test resets), its flat form and ``torch.optim.Adam``'s for the fused and native step engines
(``flat_adam.py``), and the choice of ``torch.optim.Adam``'s kernel (``adam_kernel.py``)."""

from cl_lightning.nn.optim.adam_gnt import AdamGnT
from cl_lightning.nn.optim.adam_kernel import drop_unloadable_nvml_check, prefer_fused
from cl_lightning.nn.optim.flat_adam import FlatAdam, FlatAdamGnT, FlatOptimizer, adam_refusal, flat_optimizer_type

__all__ = [
    "AdamGnT",
    "FlatAdam",
    "FlatAdamGnT",
    "FlatOptimizer",
    "adam_refusal",
    "drop_unloadable_nvml_check",
    "flat_optimizer_type",
    "prefer_fused",
]
