"""Optimiser implementation choice: Adam's fused kernel (one kernel for all parameters) rather than the per-parameter
loop PyTorch picks on CPU (the same formulas, different rounding), and the CUDA check every Adam step makes.
"""

from __future__ import annotations

import ctypes
import os

import torch

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def prefer_fused(optimizer: torch.optim.Optimizer | None) -> torch.optim.Optimizer | None:
    """Switch an Adam / AdamW whose implementation was left to PyTorch to its fused kernel where the parameters'
    device has one (CPU and CUDA do); an explicit ``foreach`` / ``fused`` / ``differentiable`` choice is kept.

    Call it before the first step (the state's step counters are created on first use in the fused layout).
    Other optimisers are returned unchanged.
    """
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return optimizer
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        devices = list(_get_fused_kernels_supported_devices())
    except ImportError:  # pragma: no cover - older torch
        devices = ["cuda"]
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

    Lightning sets the variable; every Adam step then asks ``torch.cuda.is_available()``, and a CUDA build of torch
    without a driver tries to load ``libnvidia-ml.so.1`` each time before falling back to the CUDA runtime's device
    count. Without the variable torch asks the runtime directly and caches the (same) answer
    (``benchmarks/nvml_check.py``). Called once a fit, by :class:`~cl_lightning.learners.ContinualLearner`.
    """
    if os.environ.get(NVML_CHECK) != "1" or not torch.cuda._is_compiled():
        return False
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        del os.environ[NVML_CHECK]
        return True
    return False
