"""One-point training steps in C: a chunk of regression steps per call (a learner's ``step_kernel="native"``).

On a CPU a fused step (:mod:`cl_lightning.nn.fused_steps`) costs its few dozen dispatches, not its arithmetic. Here
the same algorithm runs as one C loop over the chunk (``steps.c``): predict, MSE gradient by hand, one Adam update,
for Backprop's MLP and label-free query-only attention, on the flat tensors of
:class:`~cl_lightning.nn.optim.FlatAdam`; for Continual Backprop (:func:`cbp_mse_steps`) with AdamGnT
(:class:`~cl_lightning.nn.optim.FlatAdamGnT`) and generate-and-test's test into
:class:`~cl_lightning.nn.GenerateAndTest`'s buffers, its rare replacements in Python.

Only rounding differs from the torch path (sums in another order, ``pow`` from the C library): one step agrees to
float32 rounding (``tests/test_native_steps.py``), but over thousands of steps the trajectories drift apart as two
BLAS libraries' would (and CBP may, at a near tie, replace another unit), which is why the torch path is the default.

Each kernel takes one struct of named fields (``steps.h``'s ``*_FIELDS``), mirrored here as a
:class:`ctypes.Structure` and checked against the layout the library exports when it loads. The attention kernel is
also built once per shape, its widths compile-time constants (docs/results/scr_speed.md). The library is compiled on
first use with ``$CC`` (else ``cc``) into ``$XDG_CACHE_HOME/cl_lightning/native``, one file per source, compiler,
flags and CPU, written atomically; ``-march=native`` only where ``/proc/cpuinfo`` names the CPU, so a shared cache
never loads a binary built for another CPU. Tested on Linux x86_64 with gcc. Where no compiler works,
:func:`library` says why and the learner raises.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import platform
import shutil
import subprocess
import tempfile
import weakref
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
from torch import Tensor, nn

from cl_lightning.nn.gnt import GenerateAndTest
from cl_lightning.nn.optim import FlatAdam, FlatAdamGnT, FlatOptimizer

__all__ = ["NativeUnavailableError", "attention_mse_steps", "available", "cbp_mse_steps", "library", "mlp_mse_steps"]

_SOURCE = Path(__file__).with_name("steps.c")
_HEADER = _SOURCE.with_name("steps.h")  # the argument structs, included by steps.c
# -ffp-contract=off: no fused multiply-adds, so the numbers do not depend on the CPU's instruction set; no
# -ffast-math: sums keep their order; -fno-math-errno lets sqrtf vectorise (its result is IEEE's either way).
_FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared"]


class NativeUnavailableError(RuntimeError):
    """The C library could not be built or loaded (the message says why)."""


class _FloatPtr(ctypes.c_void_p):
    """``float *`` (kind ``f``); fields take an address (``Tensor.data_ptr()``)."""


class _Int64Ptr(ctypes.c_void_p):
    """``int64_t *`` (kind ``Q``)."""


class _PtrArray(ctypes.c_void_p):
    """A pointer to an array of pointers, one per hidden layer (kind ``P``)."""


_KIND = {_FloatPtr: "f", _Int64Ptr: "Q", _PtrArray: "P", ctypes.c_int64: "q", ctypes.c_double: "d"}
_I64, _DBL = ctypes.c_int64, ctypes.c_double
_NET = [  # NET_FIELDS
    ("flat", _FloatPtr), ("grad", _FloatPtr), ("exp_avg", _FloatPtr), ("exp_avg_sq", _FloatPtr), ("numel", _I64),
    ("layers", _I64), ("sizes", _Int64Ptr), ("w_off", _Int64Ptr), ("b_off", _Int64Ptr),
]  # fmt: skip
_ADAM = [  # ADAM_FIELDS
    ("first_step", _DBL), ("lr", _DBL), ("beta1", _DBL), ("beta2", _DBL), ("eps", _DBL), ("weight_decay", _DBL),
    ("decoupled", _I64),
]  # fmt: skip
_DATA = [("xs", _FloatPtr), ("ys", _FloatPtr), ("preds", _FloatPtr), ("steps", _I64), ("batch", _I64)]


class _MlpArgs(ctypes.Structure):
    """``mlp_args`` (MLP_FIELDS): the MLP's steps with Adam."""

    _fields_ = [*_NET, *_ADAM, *_DATA]


class _AttentionArgs(ctypes.Structure):
    """``attention_args`` (ATTENTION_FIELDS): query-only attention's steps along a window, with Adam."""

    _fields_ = [
        *_NET, *_ADAM, ("window_x", _FloatPtr), ("window_y", _FloatPtr), ("d", _I64), ("k", _I64),
        ("support", _I64), ("preds", _FloatPtr), ("steps", _I64),
    ]  # fmt: skip


class _GntArgs(ctypes.Structure):
    """``gnt_args`` (GNT_FIELDS): Continual Backprop's steps (AdamGnT, generate-and-test's test)."""

    _fields_ = [
        *_NET, ("element_step", _FloatPtr), *_DATA, ("lr", _DBL), ("beta1", _DBL), ("beta2", _DBL), ("eps", _DBL),
        ("weight_decay", _DBL), ("reference", _I64), ("test", _I64), ("decay_rate", _DBL), ("adaptable", _I64),
        ("util", _PtrArray), ("bc_util", _PtrArray), ("mean_act", _PtrArray), ("age", _PtrArray),
    ]  # fmt: skip


# GNT_FIELDS' per-layer buffer arrays -> the GenerateAndTest buffers they point to
_TEST_BUFFERS = {"util": "util", "bc_util": "bias_corrected_util", "mean_act": "mean_act", "age": "age"}
_KERNELS = {"mlp_mse_adam": _MlpArgs, "attention_mse_adam": _AttentionArgs, "mlp_mse_adam_gnt": _GntArgs}


class _FieldLayout(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("offset", _I64), ("size", _I64), ("kind", _I64)]


class _StructLayout(ctypes.Structure):
    _fields_ = [("size", _I64), ("count", _I64), ("fields", ctypes.POINTER(_FieldLayout))]


def _check_layouts(lib: ctypes.CDLL, path: Path) -> None:
    """Every kernel's argument struct as compiled (``<kernel>_layout``) against its :class:`ctypes.Structure`:
    :class:`NativeUnavailableError` naming the first field that differs."""
    for kernel, args in _KERNELS.items():
        try:
            table = _StructLayout.in_dll(lib, f"{kernel}_layout")
        except ValueError as error:  # a library without the table: not built from this steps.c
            raise NativeUnavailableError(f"{path.name} as built exports no {kernel}_layout: {error}") from error
        compiled = [(f.name.decode(), f.offset, f.size, chr(f.kind)) for f in table.fields[: table.count]]
        fields = [(name, getattr(args, name), kind) for name, kind in args._fields_]  # as steps.c's tables give them
        mirrored = [(name, field.offset, field.size, _KIND[kind]) for name, field, kind in fields]
        if compiled != mirrored or table.size != ctypes.sizeof(args):
            pairs = itertools.zip_longest(compiled, mirrored, fillvalue="nothing")
            first, (c, m) = next(((i, pair) for i, pair in enumerate(pairs) if pair[0] != pair[1]), (-1, ("", "")))
            raise NativeUnavailableError(
                f"{kernel}'s arguments differ between {path.name} and {Path(__file__).name}: "
                + (f"field {first} (name, offset, size, kind) is {c} in C, {m} in Python" if first >= 0 else "")
                + f"; the struct is {table.size} bytes in C, {ctypes.sizeof(args)} in Python"
            )
        fn = getattr(lib, kernel)
        fn.argtypes, fn.restype = [ctypes.POINTER(args)], ctypes.c_int


def _cpu_tag() -> str | None:
    """What ``-march=native`` depends on (the CPU's model and flags); ``None`` where ``/proc/cpuinfo`` lacks them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    found = [
        next((line for line in lines if line.split(":")[0].strip() == key), None) for key in ("model name", "flags")
    ]
    return None if None in found else "\n".join(found)


def _load(defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """``steps.c`` built with ``defines`` (``-D`` flags), from the cache or compiled into it, loaded and checked."""
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise NativeUnavailableError(
            f"step_kernel=native: no C compiler: {compiler!r} is not on PATH "
            "(install one, e.g. apt install gcc, or set CC)"
        )
    cpu = _cpu_tag()
    flags = [*_FLAGS, *(["-march=native"] if cpu else []), *defines]
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    parts = [" ".join([compiler, *flags]), version, cpu or platform.machine()]
    key = hashlib.sha256(b"\0".join([_SOURCE.read_bytes(), _HEADER.read_bytes(), *(p.encode() for p in parts)]))
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cl_lightning" / "native"
    target = cache_root / f"steps-{key.hexdigest()[:16]}.so"
    if not target.exists():
        cache_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_root) as tmp:
            built = Path(tmp) / "steps.so"
            done = subprocess.run(
                [compiler, *flags, "-o", str(built), str(_SOURCE), "-lm"], capture_output=True, text=True
            )
            if done.returncode != 0:
                raise NativeUnavailableError(f"{compiler} failed to build {_SOURCE.name}:\n{done.stderr.strip()}")
            os.replace(built, target)  # atomic: a concurrent build leaves one complete file
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as error:  # a broken file
        raise NativeUnavailableError(f"cannot load {target}: {error}") from error
    _check_layouts(lib, _SOURCE)
    return lib


@cache
def library() -> ctypes.CDLL:
    """The compiled kernels, built on first use; :class:`NativeUnavailableError` if they cannot be."""
    return _load()


@cache
def _attention_library(d: int, width: int, k: int) -> ctypes.CDLL:
    """The kernels built with the attention scorer's shape (``d`` inputs, ``width`` first-layer units, ``k`` outputs)
    as constants: one library per shape, built on its first call."""
    library()  # the generic build first: a missing compiler is said once, as there
    return _load((f"-DATTENTION_D={d}", f"-DATTENTION_H0={width}", f"-DATTENTION_K={k}"))


def available() -> bool:
    """Whether the kernels build and load on this machine (:func:`library` says why not)."""
    try:
        library()
    except NativeUnavailableError:
        return False
    return True


_LAYOUTS: weakref.WeakKeyDictionary[FlatOptimizer, tuple] = weakref.WeakKeyDictionary()


def _layout(adam: FlatOptimizer, layers: list[nn.Linear], sizes: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """``layers``' widths and the offsets of their weights and biases in ``adam``'s flat tensors (int64); made once
    per binding (the same tensors while ``adam`` keeps its offsets and the layers their parameters: making three
    small tensors costs more than a one-step kernel call)."""
    params = [p for layer in layers for p in (layer.weight, layer.bias)]
    cached = _LAYOUTS.get(adam)
    if cached is not None:
        offsets_then, sizes_then, params_then, layout = cached
        same = len(params_then) == len(params) and all(a is b for a, b in zip(params_then, params, strict=False))
        if offsets_then is adam._offsets and sizes_then == sizes and same:
            return layout
    offset = {id(p): o for p, o in zip(adam.params, adam._offsets, strict=False)}  # _offsets ends with the length
    w_off = torch.tensor([offset[id(layer.weight)] for layer in layers], dtype=torch.int64)
    b_off = torch.tensor([offset[id(layer.bias)] for layer in layers], dtype=torch.int64)
    layout = torch.tensor(sizes, dtype=torch.int64), w_off, b_off
    _LAYOUTS[adam] = (adam._offsets, list(sizes), params, layout)
    return layout


def _net(adam: FlatOptimizer, layout: tuple[Tensor, Tensor, Tensor], depth: int) -> dict[str, int]:
    """The NET_FIELDS: ``adam``'s flat tensors, the layer count and the layout (:func:`_layout`, which the caller
    keeps alive while the kernel runs)."""
    m, v = adam.moments["exp_avg"], adam.moments["exp_avg_sq"]
    sizes, w_off, b_off = (t.data_ptr() for t in layout)
    return {
        "flat": adam.flat.data_ptr(), "grad": adam.grad.data_ptr(), "exp_avg": m.data_ptr(),
        "exp_avg_sq": v.data_ptr(), "numel": adam.flat.numel(), "layers": depth, "sizes": sizes, "w_off": w_off,
        "b_off": b_off,
    }  # fmt: skip


def _adam(adam: FlatAdam, steps: int) -> dict[str, float | int]:
    """The ADAM_FIELDS for ``steps`` steps numbered from the count ``adam`` holds (which advances by ``steps``)."""
    h = adam.hyperparameters
    first = float(adam.advance(steps))
    return {
        "first_step": first, "lr": h.lr, "beta1": h.beta1, "beta2": h.beta2, "eps": h.eps,
        "weight_decay": h.weight_decay, "decoupled": int(h.decoupled),
    }  # fmt: skip


def _mlp_data(
    layers: list[nn.Linear], adam: FlatOptimizer, xs: Tensor, ys: Tensor
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:
    """What an MLP kernel reads and writes: ``xs (T, B, D)`` and ``ys (T, B, k)`` contiguous in float32, the
    predictions ``(T, B, k)`` to fill, and the layers' :func:`_layout`."""
    xs, ys = xs.contiguous().float(), ys.contiguous().float()
    layout = _layout(adam, layers, [layers[0].in_features, *(layer.out_features for layer in layers)])
    return xs, ys, xs.new_empty(*xs.shape[:2], ys.shape[2]), layout


def _check(status: int) -> None:
    if status != 0:
        raise MemoryError("the native step kernel could not allocate its scratch memory")


@torch.no_grad()
def mlp_mse_steps(layers: list[nn.Linear], adam: FlatAdam, xs: Tensor, ys: Tensor) -> Tensor:
    """:func:`cl_lightning.nn.fused_steps.mlp_steps` (no ``after_step``) in one C call: ``xs (T, B, D)``,
    ``ys (T, B, k)`` ``-> predictions (T, B, k)``, each made before its step."""
    xs, ys, preds, layout = _mlp_data(layers, adam, xs, ys)
    steps, batch, _ = xs.shape
    args = _MlpArgs(
        **_net(adam, layout, len(layers)), **_adam(adam, steps),
        xs=xs.data_ptr(), ys=ys.data_ptr(), preds=preds.data_ptr(), steps=steps, batch=batch,
    )  # fmt: skip
    _check(library().mlp_mse_adam(ctypes.byref(args)))
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
    layout = _layout(adam, [first, *layers], [first.out_features, *(layer.out_features for layer in layers)])
    args = _AttentionArgs(
        **_net(adam, layout, len(layers)), **_adam(adam, steps), window_x=window_x.data_ptr(),
        window_y=window_y.data_ptr(), d=d, k=k, support=support_size, preds=preds.data_ptr(), steps=steps,
    )  # fmt: skip
    _check(_attention_library(d, first.out_features, k).attention_mse_adam(ctypes.byref(args)))
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
    """:func:`cl_lightning.nn.fused_steps.mlp_steps` with generate-and-test after each update (Continual
    Backprop): ``xs (T, B, D)``, ``ys (T, B, k)`` ``-> predictions (T, B, k)``, each made before its step.

    Which steps replace units depends on the host counts only (:meth:`GenerateAndTest.next_counts`, accumulated
    fractions), so they are known before the chunk runs: the C kernel runs the steps up to and including the next
    such step (forward, backward, AdamGnT, the test of every hidden layer into ``gnt``'s buffers), then
    :meth:`GenerateAndTest.replace` chooses and redraws the units with ``generator_at(t)`` (step ``t`` of the chunk)
    and resets their AdamGnT state in ``adam``'s flat tensors, as the torch path does; and so on to the chunk's end.
    """
    assert gnt.accumulate, "the learner refuses accumulate=False with the native kernel"
    xs, ys, preds, layout = _mlp_data(layers, adam, xs, ys)
    steps, batch, _ = xs.shape
    h = adam.hyperparameters
    buffers = {  # per hidden layer: data pointers of the test's buffers (kept alive with `args`)
        field: (ctypes.c_void_p * gnt.num_layers)(*(gnt.buffer(name, i).data_ptr() for i in range(gnt.num_layers)))
        for field, name in _TEST_BUFFERS.items()
    }
    args = _GntArgs(
        **_net(adam, layout, len(layers)), element_step=adam.moments["element_step"].data_ptr(), batch=batch,
        lr=h.lr, beta1=h.beta1, beta2=h.beta2, eps=h.eps, weight_decay=h.weight_decay,
        reference=int(h.update_rule == "reference"), test=int(gnt.replacement_rate > 0), decay_rate=gnt.decay_rate,
        adaptable=int(gnt.utility == "adaptable_contribution"),
        **{field: ctypes.addressof(array) for field, array in buffers.items()},
    )  # fmt: skip
    row_x, row_y = batch * xs.shape[2], batch * ys.shape[2]  # floats per step

    def run(start: int, stop: int) -> None:  # steps start..stop-1 in C
        if stop > start:
            args.xs, args.ys = _offset(xs, start * row_x), _offset(ys, start * row_y)
            args.preds, args.steps = _offset(preds, start * row_y), stop - start
            _check(library().mlp_mse_adam_gnt(ctypes.byref(args)))

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


def _offset(t: Tensor, elements: int) -> int:
    """The address ``elements`` into a contiguous float32 tensor."""
    return t.data_ptr() + 4 * elements
