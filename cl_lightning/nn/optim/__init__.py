"""Optimisers: every Adam the package runs, in one place.

- :class:`AdamGnT` (``adam_gnt.py``): Adam with per-element step counts, whose state generate-and-test resets for a
  replaced unit (Continual Backprop), with the authors' update rule or the corrected one;
- :class:`FlatAdam` / :class:`FlatAdamGnT` (``flat_adam.py``): ``torch.optim.Adam`` / ``AdamW`` and :class:`AdamGnT`
  over views of one flat tensor, bit for bit, for the fused and native step engines; :func:`adam_refusal` names an
  optimiser they cannot reproduce;
- which kernel ``torch.optim.Adam`` runs (``adam_kernel.py``): :func:`prefer_fused`, and
  :func:`drop_unloadable_nvml_check` for the CUDA check every Adam step makes.
"""

from cl_lightning.nn.optim.adam_gnt import AdamGnT
from cl_lightning.nn.optim.adam_kernel import drop_unloadable_nvml_check, prefer_fused
from cl_lightning.nn.optim.flat_adam import FlatAdam, FlatAdamGnT, FlatOptimizer, adam_refusal

__all__ = [
    "AdamGnT",
    "FlatAdam",
    "FlatAdamGnT",
    "FlatOptimizer",
    "adam_refusal",
    "drop_unloadable_nvml_check",
    "prefer_fused",
]
