"""Optimiser implementation choice: the fused (one kernel for all parameters) or multi-tensor form of Adam, and the
CUDA check every Adam step makes.

PyTorch picks the per-parameter Python loop for Adam on CPU unless told otherwise. On a QOA training step (twelve
parameter tensors of the 101,901-parameter scorer) the loop took 2.46 ms against 0.25 ms with ``fused=True``
(about a tenth of the step). The fused kernels compute the same update (same formulas, ``eps`` outside the square
root); they differ from the loop only in rounding.
"""

from __future__ import annotations

import ctypes
import os

import torch

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"

_FUSABLE = (torch.optim.Adam, torch.optim.AdamW)


def _fused_devices() -> list[str]:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return list(_get_fused_kernels_supported_devices())
    except ImportError:  # pragma: no cover - older torch
        return ["cuda"]


def prefer_fused(optimizer: torch.optim.Optimizer | None) -> torch.optim.Optimizer | None:
    """Switch an Adam / AdamW whose implementation was left to PyTorch to its fused kernel where the parameters'
    device has one (CPU and CUDA do); an explicit ``foreach`` / ``fused`` / ``differentiable`` choice is kept.

    Call it before the first step (the state's step counters are created on first use in the fused layout).
    Other optimisers are returned unchanged.
    """
    if not isinstance(optimizer, _FUSABLE):
        return optimizer
    devices = _fused_devices()
    for group in optimizer.param_groups:
        if group.get("fused") or group.get("foreach") or group.get("differentiable"):
            continue
        params = group["params"]
        if params and all(p.device.type in devices and p.dtype.is_floating_point for p in params):
            group["fused"], group["foreach"] = True, False
    if any(g.get("fused") for g in optimizer.param_groups):
        optimizer._step_supports_amp_scaling = True  # as Adam.__init__ sets it for fused=True
    return optimizer


def drop_unloadable_nvml_check() -> bool:
    """Unset ``PYTORCH_NVML_BASED_CUDA_CHECK`` when NVML cannot be loaded; ``True`` when it did.

    Importing Lightning sets the variable (so that asking whether CUDA is available does not poison forked
    workers). Every ``torch.optim`` Adam / AdamW step asks (its graph-capture check calls
    ``torch.cuda.is_available()``), and with the variable set, a CUDA build of torch on a machine without a driver
    tries to load ``libnvidia-ml.so.1`` each time, fails, and falls back to the CUDA runtime's device count:
    about 80-140 µs a step (``benchmarks/nvml_check.py``). Without the variable it asks the runtime directly, whose
    answer torch caches: the same answer (the fallback is that very call), about 1 µs. Where NVML loads (a GPU
    machine), the variable is kept. Called once a fit, by :class:`~cl_lightning.learners.ContinualLearner`.
    """
    if os.environ.get(NVML_CHECK) != "1" or not torch.cuda._is_compiled():
        return False
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        del os.environ[NVML_CHECK]
        return True
    return False
