"""One-point training steps in C: a chunk of regression steps per call (a learner's ``step_kernel="native"``).

A fused step of :mod:`cl_lightning.nn.fused_steps` still dispatches a few dozen tiny tensor operations per point,
and on a CPU that dispatch, not the arithmetic, is the step's cost. Here the same algorithm runs as one C loop over
the chunk (``steps.c``): predict, MSE gradient by hand, one Adam update, for Backprop's MLP and for label-free
query-only attention, on the flat tensors of :class:`~cl_lightning.nn.flat_adam.FlatAdam` (so checkpoints,
probes and monitors see the same parameters and optimiser state).

Continual Backprop (:func:`cbp_mse_steps`): the MLP step with AdamGnT on the flat tensors of
:class:`~cl_lightning.nn.flat_adam.FlatAdamGnT` (a step count per element, both update rules), then generate-and-
test's test of every hidden layer (ages, utilities, mean activations) into :class:`~cl_lightning.nn.GenerateAndTest`'s
buffers. Its replacements (about one unit every 25 steps on slowly changing regression) stay in Python, in
:meth:`GenerateAndTest.replace <cl_lightning.nn.gnt.GenerateAndTest.replace>`: the steps at which a layer replaces
units follow from the host counts alone (accumulated fractions; ``accumulate=False`` draws at every step and is
refused), so the kernel runs up to each such step and Python chooses, redraws (the torch path's generator draws) and
resets the units' AdamGnT state in the flat tensors before the kernel goes on.

What differs from the torch path is rounding only: matrix products summed in another order, Adam's formulas without
torch's vectorised loops, ``pow`` from the C library rather than SLEEF. One step agrees with the torch path to
float32 rounding (``tests/test_native_steps.py``; CBP over 300 steps with replacements: the same units replaced,
every number to float32 rounding); over thousands of steps the trajectories drift apart as two BLAS libraries
would (and CBP may, at a near tie of two utilities, replace another unit), so a run made with one kernel is not bit
for bit a run made with the other. That is why the torch path stays the default.

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
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
from torch import Tensor, nn

from cl_lightning.nn.flat_adam import FlatAdam, FlatAdamGnT, FlatOptimizer
from cl_lightning.nn.gnt import GenerateAndTest

__all__ = ["attention_mse_steps", "cbp_mse_steps", "library", "mlp_mse_steps", "refusal"]

_SOURCE = Path(__file__).with_name("steps.c")
# -ffp-contract=off: no fused multiply-adds, so the numbers do not depend on the CPU's instruction set; no
# -ffast-math: sums keep their order; -fno-math-errno lets sqrtf vectorise (its result is IEEE's either way).
_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared"]
_I64, _F32P, _DBL = ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.c_double
_I64P, _PTRS = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p)
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
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as error:  # built elsewhere for another CPU, or a broken file
        raise NativeUnavailableError(f"cannot load {target}: {error}") from error
    lib.mlp_mse_adam.argtypes = [*_HEAD, _F32P, _F32P, _F32P, _I64, _I64, _DBL, *_ADAM]
    lib.attention_mse_adam.argtypes = [*_HEAD, _F32P, _F32P, _I64, _I64, _I64, _F32P, _I64, _DBL, *_ADAM]
    gnt = [ctypes.c_int, _DBL, ctypes.c_int, _PTRS, _PTRS, _PTRS, _PTRS]  # test, η, adaptable, the buffers per layer
    lib.mlp_mse_adam_gnt.argtypes = [*_HEAD, _F32P, _F32P, _F32P, _F32P, _I64, _I64, *_ADAM, *gnt]
    for fn in (lib.mlp_mse_adam, lib.attention_mse_adam, lib.mlp_mse_adam_gnt):
        fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether the kernels build and load on this machine (:func:`library` says why not)."""
    try:
        library()
    except NativeUnavailableError:
        return False
    return True


def refusal(adam: FlatOptimizer | None, kind: type[FlatOptimizer] = FlatAdam) -> str | None:
    """Why the native kernels cannot run this batch's fused step (``None`` when they can): they implement Adam /
    AdamW (``kind`` :class:`FlatAdam`, Backprop and QOA) or AdamGnT (:class:`FlatAdamGnT`, Continual Backprop) on
    float32 CPU tensors."""
    if not isinstance(adam, kind):
        wanted = "AdamGnT" if kind is FlatAdamGnT else "Adam / AdamW"
        return f"the optimiser is {type(adam._optimizer).__name__ if adam else None}, not {wanted}"
    if adam.flat.dtype != torch.float32 or adam.flat.device.type != "cpu":
        return "the parameters are not float32 on the CPU"
    return None


def _ptr(t: Tensor, kind: type = _F32P) -> ctypes._Pointer:
    return ctypes.cast(t.data_ptr(), kind)


def _layout(adam: FlatOptimizer, layers: list[nn.Linear], sizes: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """``layers``' widths and the offsets of their weights and biases in ``adam``'s flat tensors (int64)."""
    index = {id(p): i for i, p in enumerate(adam.params)}
    offsets = adam._offsets
    w_off = torch.tensor([offsets[index[id(layer.weight)]] for layer in layers], dtype=torch.int64)
    b_off = torch.tensor([offsets[index[id(layer.bias)]] for layer in layers], dtype=torch.int64)
    return torch.tensor(sizes, dtype=torch.int64), w_off, b_off


def _head(adam: FlatOptimizer, layout: tuple[Tensor, Tensor, Tensor], depth: int) -> tuple[object, ...]:
    """The kernels' first arguments: ``adam``'s flat tensors, the layer count and the layout (:func:`_layout`)."""
    m, v = adam.moments["exp_avg"], adam.moments["exp_avg_sq"]
    sizes, w_off, b_off = (_ptr(t, _I64P) for t in layout)
    return _ptr(adam.flat), _ptr(adam.grad), _ptr(m), _ptr(v), adam.flat.numel(), depth, sizes, w_off, b_off


def _check(status: int) -> None:
    if status != 0:
        raise MemoryError("the native step kernel could not allocate its scratch memory")


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
    layout = _layout(adam, layers, sizes)
    first = float(adam.advance(steps))
    hyper = adam._hyper
    adam_args = (hyper["lr"], hyper["beta1"], hyper["beta2"], hyper["eps"], hyper["weight_decay"])
    _check(fn(*_head(adam, layout, depth), *data, first, *adam_args, int(adam._decoupled)))


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


@torch.no_grad()
def cbp_mse_steps(
    layers: list[nn.Linear],
    adam: FlatAdamGnT,
    gnt: GenerateAndTest,
    xs: Tensor,
    ys: Tensor,
    optimizer: torch.optim.Optimizer,
    generator_at: Callable[[int], torch.Generator],
) -> Tensor:
    """:func:`cl_lightning.nn.fused_steps.mlp_mse_steps` with generate-and-test after each update (Continual
    Backprop): ``xs (T, B, D)``, ``ys (T, B, k)`` ``-> predictions (T, B, k)``, each made before its step.

    Which steps replace units depends on the host counts only (:meth:`GenerateAndTest.next_counts`, accumulated
    fractions), so they are known before the chunk runs: the C kernel runs the steps up to and including the next
    such step (forward, backward, AdamGnT, the test of every hidden layer into ``gnt``'s buffers), then
    :meth:`GenerateAndTest.replace` chooses and redraws the units with ``generator_at(t)`` (step ``t`` of the chunk)
    and resets their AdamGnT state in ``adam``'s flat tensors, as the torch path does; and so on to the chunk's end.
    """
    assert gnt.accumulate, "the learner refuses accumulate=False with the native kernel"
    steps, batch, _ = xs.shape
    xs, ys = xs.contiguous().float(), ys.contiguous().float()
    preds = xs.new_empty(steps, batch, ys.shape[2])
    sizes = [layers[0].in_features, *(layer.out_features for layer in layers)]
    layout = _layout(adam, layers, sizes)  # kept alive while the kernel reads it
    lr, beta1, beta2, decay, eps = adam._hyper
    buffers = [  # per hidden layer: data pointers of the test's buffers
        (ctypes.c_void_p * gnt.num_layers)(*(gnt.buffer(name, i).data_ptr() for i in range(gnt.num_layers)))
        for name in ("util", "bias_corrected_util", "mean_act", "age")
    ]
    fixed = (lr, beta1, beta2, eps, decay, int(adam._rule == "reference"), int(gnt.replacement_rate > 0))
    fixed += (gnt.decay_rate, int(gnt.utility == "adaptable_contribution"), *buffers)
    head = (*_head(adam, layout, len(layers)), _ptr(adam.moments["element_step"]))
    row_x, row_y = batch * xs.shape[2], batch * ys.shape[2]  # floats per step

    def run(start: int, stop: int) -> None:  # steps start..stop-1 in C
        if stop > start:
            data = (_offset(xs, start * row_x), _offset(ys, start * row_y), _offset(preds, start * row_y))
            _check(library().mlp_mse_adam_gnt(*head, *data, stop - start, batch, *fixed))

    done = 0
    events = [] if gnt.replacement_rate == 0 else [(t, gnt.next_counts(None)) for t in range(steps)]
    for t, counts in events:
        if any(counts):
            run(done, t + 1)
            gnt.replace(layers, counts, optimizer, generator_at(t))
            done = t + 1
    run(done, steps)
    gnt.store_carried()
    return preds


def _offset(t: Tensor, elements: int) -> ctypes._Pointer:
    """A float pointer ``elements`` into a contiguous float32 tensor."""
    return ctypes.cast(t.data_ptr() + 4 * elements, _F32P)
