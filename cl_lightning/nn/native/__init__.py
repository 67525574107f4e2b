"""One-point training steps in C: a chunk of regression steps per call (a learner's ``step_kernel="native"``).

A fused step of :mod:`cl_lightning.nn.fused_steps` still dispatches a few dozen tiny tensor operations per point,
and on a CPU that dispatch, not the arithmetic, is the step's cost. Here the same algorithm runs as one C loop over
the chunk (``steps.c``): predict, MSE gradient by hand, one Adam update, for Backprop's MLP and for label-free
query-only attention, on the flat tensors of :class:`~cl_lightning.nn.flat_adam.FlatAdam` (so checkpoints,
probes and monitors see the same parameters and optimiser state).

What differs from the torch path is rounding only: matrix products summed in another order, Adam's formulas without
torch's vectorised loops. One step agrees with the torch path to float32 rounding (``tests/test_native_steps.py``);
over thousands of steps the trajectories drift apart as two BLAS libraries would, so a run made with one kernel is
not bit for bit a run made with the other. That is why the torch path stays the default.

The library is compiled on first use with the system C compiler (``$CC``, else ``cc``) into
``$XDG_CACHE_HOME/cl_lightning/native`` (``~/.cache`` by default), one file per source, flags and CPU, written
atomically (concurrent trials may build it at once). Where no compiler works, :func:`library` says why and the
learner raises.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch
from torch import Tensor, nn

from cl_lightning.nn.flat_adam import FlatAdam, FlatOptimizer

__all__ = ["attention_mse_steps", "library", "mlp_mse_steps", "refusal"]

_SOURCE = Path(__file__).with_name("steps.c")
# -ffp-contract=off: no fused multiply-adds, so the numbers do not depend on the CPU's instruction set; no
# -ffast-math: sums keep their order; -fno-math-errno lets sqrtf vectorise (its result is IEEE's either way).
_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared"]
_I64, _F32P, _DBL = ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.c_double
_I64P = ctypes.POINTER(ctypes.c_int64)
_HEAD = [_F32P, _F32P, _F32P, _F32P, _I64, _I64, _I64P, _I64P, _I64P]  # flat, grad, moments, numel, layers, offsets
_ADAM = [_DBL, _DBL, _DBL, _DBL, _DBL, ctypes.c_int]  # lr, β1, β2, ε, weight decay, decoupled


class NativeUnavailableError(RuntimeError):
    """The C library could not be built or loaded (the message says why)."""


def _cpu_tag() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags (a shared cache may serve several machines)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    return "\n".join(next((line for line in lines if line.startswith(key)), "") for key in ("model name", "flags"))


@cache
def library() -> ctypes.CDLL:
    """The compiled kernels, built on first use (see the module docstring); :class:`NativeUnavailableError` if they
    cannot be."""
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise NativeUnavailableError(f"no C compiler: {compiler!r} is not on PATH (set CC)")
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join([compiler, *_FLAGS]).encode(), _cpu_tag().encode()]))
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cl_lightning" / "native"
    target = cache_root / f"steps-{key.hexdigest()[:16]}.so"
    if not target.exists():
        cache_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_root) as tmp:
            built = Path(tmp) / "steps.so"
            done = subprocess.run(
                [compiler, *_FLAGS, "-o", str(built), str(_SOURCE), "-lm"], capture_output=True, text=True
            )
            if done.returncode != 0:
                raise NativeUnavailableError(f"{compiler} failed to build {_SOURCE.name}:\n{done.stderr.strip()}")
            os.replace(built, target)  # atomic: a concurrent build leaves one complete file
    lib = ctypes.CDLL(str(target))
    lib.mlp_mse_adam.argtypes = [*_HEAD, _F32P, _F32P, _F32P, _I64, _I64, _DBL, *_ADAM]
    lib.attention_mse_adam.argtypes = [*_HEAD, _F32P, _F32P, _I64, _I64, _I64, _F32P, _I64, _DBL, *_ADAM]
    for fn in (lib.mlp_mse_adam, lib.attention_mse_adam):
        fn.restype = ctypes.c_int
    return lib


def refusal(adam: FlatOptimizer | None) -> str | None:
    """Why the native kernels cannot run this batch's fused step (``None`` when they can): they implement Adam /
    AdamW (:class:`FlatAdam`) on float32 CPU tensors."""
    if not isinstance(adam, FlatAdam):
        return f"the optimiser is {type(adam._optimizer).__name__ if adam else None}, not Adam / AdamW"
    if adam.flat.dtype != torch.float32 or adam.flat.device.type != "cpu":
        return "the parameters are not float32 on the CPU"
    return None


def _ptr(t: Tensor, kind: type = _F32P) -> ctypes._Pointer:
    return ctypes.cast(t.data_ptr(), kind)


def _call(
    fn: ctypes._CFuncPtr,
    adam: FlatAdam,
    layers: list[nn.Linear],
    depth: int,
    steps: int,
    sizes: list[int],
    *data: object,
) -> None:
    """Call ``fn`` on ``adam``'s flat tensors and ``layers``' offsets in them (``depth``: the kernel's layer count),
    for ``steps`` steps numbered from the count ``adam`` holds (which advances by ``steps``), with the
    kernel-specific ``data`` in between."""
    index = {id(p): i for i, p in enumerate(adam.params)}
    offsets = adam._offsets
    w_off = torch.tensor([offsets[index[id(layer.weight)]] for layer in layers], dtype=torch.int64)
    b_off = torch.tensor([offsets[index[id(layer.bias)]] for layer in layers], dtype=torch.int64)
    sizes_t = torch.tensor(sizes, dtype=torch.int64)
    first = float(adam.advance(steps))
    m, v = adam.moments["exp_avg"], adam.moments["exp_avg_sq"]
    hyper = adam._hyper
    status = fn(
        _ptr(adam.flat), _ptr(adam.grad), _ptr(m), _ptr(v), adam.flat.numel(), depth,
        _ptr(sizes_t, _I64P), _ptr(w_off, _I64P), _ptr(b_off, _I64P), *data, first,
        hyper["lr"], hyper["beta1"], hyper["beta2"], hyper["eps"], hyper["weight_decay"], int(adam._decoupled),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("the native step kernel could not allocate its scratch memory")


@torch.no_grad()
def mlp_mse_steps(layers: list[nn.Linear], adam: FlatAdam, xs: Tensor, ys: Tensor) -> Tensor:
    """:func:`cl_lightning.nn.fused_steps.mlp_mse_steps` (no ``after_step``) in one C call: ``xs (T, B, D)``,
    ``ys (T, B, k)`` ``-> predictions (T, B, k)``, each made before its step."""
    steps, batch, _ = xs.shape
    xs, ys = xs.contiguous().float(), ys.contiguous().float()
    preds = xs.new_empty(steps, batch, ys.shape[2])
    sizes = [layers[0].in_features, *(layer.out_features for layer in layers)]
    _call(
        library().mlp_mse_adam, adam, layers, len(layers), steps, sizes, _ptr(xs), _ptr(ys), _ptr(preds), steps, batch
    )
    return preds


@torch.no_grad()
def attention_mse_steps(
    first: nn.Linear, layers: list[nn.Linear], adam: FlatAdam, window_x: Tensor, window_y: Tensor, support_size: int
) -> Tensor:
    """:func:`cl_lightning.nn.fused_steps.attention_mse_steps` in one C call: ``window_x (S + T, D)``,
    ``window_y (S + T, k)`` ``-> predictions (T, 1, k)``, each made before its step."""
    (rows, d), k = window_x.shape, window_y.shape[1]
    steps = rows - support_size
    window_x, window_y = window_x.contiguous().float(), window_y.contiguous().float()
    preds = window_x.new_empty(steps, 1, k)
    sizes = [first.out_features, *(layer.out_features for layer in layers)]
    data = (_ptr(window_x), _ptr(window_y), d, k, support_size, _ptr(preds), steps)
    _call(library().attention_mse_adam, adam, [first, *layers], len(layers), steps, sizes, *data)
    return preds
