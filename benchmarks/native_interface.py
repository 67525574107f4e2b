"""The native step kernel's two possible interfaces on this machine, built and timed: ctypes with one typed argument
struct per kernel (``cl_lightning.nn.native``, what the package uses) against a torch C++ extension
(``torch.utils.cpp_extension``: typed C++ signatures on tensors) calling the same kernels.

- ``build``: seconds from a clean cache to kernels ready for Backprop and QOA. ctypes: ``steps.c`` compiled by the
  C compiler twice (the generic library and QOA's shape, ``nn.native``'s own code path); cpp_extension: ``steps.c``
  compiled once as an object (QOA's shape), then a C++ binding that includes ``steps.h`` and ``torch/extension.h``
  compiled and linked by ``load_inline`` (needs ``ninja`` and a C++ compiler). Wall seconds, and the CPU seconds of
  the compiler processes.
- ``step``: µs per step of the bare kernels (Backprop's 20-40-1 net, QOA's 20-unit scorer against 100 supports), T
  steps per call: the configured 1,000 (``configs/data/scr.yaml``), and 1, a call per step, where the interface's own
  cost shows. Both paths do the same Python work per call (layout, step count, hyper-parameters); process CPU time.

Rounds interleaved, the order reversed every other round; ``--no-cpp``: the ctypes rows only.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from itertools import count
from pathlib import Path
from statistics import median
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.harness import Bench, interleave, parser
from cl_lightning.nn import MLP, PairScorer, native
from cl_lightning.nn.optim import FlatAdam

_BINDING = r"""
#include "steps.h"

static float *f32(const torch::Tensor &t) {
    TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.device().is_cpu(), "float32 on the CPU");
    return t.data_ptr<float>();
}
static const int64_t *i64(const torch::Tensor &t) {
    TORCH_CHECK(t.scalar_type() == torch::kInt64 && t.is_contiguous() && t.device().is_cpu(), "int64 on the CPU");
    return t.data_ptr<int64_t>();
}

void mlp(torch::Tensor flat, torch::Tensor grad, torch::Tensor exp_avg, torch::Tensor exp_avg_sq, torch::Tensor sizes,
         torch::Tensor w_off, torch::Tensor b_off, torch::Tensor xs, torch::Tensor ys, torch::Tensor preds,
         double first_step, double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled) {
    const mlp_args a{f32(flat), f32(grad), f32(exp_avg), f32(exp_avg_sq), flat.numel(), sizes.numel() - 1, i64(sizes),
                     i64(w_off), i64(b_off), first_step, lr, beta1, beta2, eps, weight_decay, decoupled, f32(xs),
                     f32(ys), f32(preds), xs.size(0), xs.size(1)};
    TORCH_CHECK(mlp_mse_adam(&a) == 0, "no scratch memory");
}

void attention(torch::Tensor flat, torch::Tensor grad, torch::Tensor exp_avg, torch::Tensor exp_avg_sq,
               torch::Tensor sizes, torch::Tensor w_off, torch::Tensor b_off, torch::Tensor window_x,
               torch::Tensor window_y, int64_t support, torch::Tensor preds, double first_step, double lr, double beta1,
               double beta2, double eps, double weight_decay, bool decoupled) {
    const attention_args a{f32(flat), f32(grad), f32(exp_avg), f32(exp_avg_sq), flat.numel(), sizes.numel() - 1,
                           i64(sizes), i64(w_off), i64(b_off), first_step, lr, beta1, beta2, eps, weight_decay,
                           decoupled, f32(window_x), f32(window_y), window_x.size(1), window_y.size(1), support,
                           f32(preds), preds.size(0)};
    TORCH_CHECK(attention_mse_adam(&a) == 0, "no scratch memory");
}
"""
_QOA_SHAPE = (20, 20, 1)  # QOA's scorer on SCR: 20 inputs, 20 first-layer units, 1 output
_names = count()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed_build(build: Callable[[Path], Any]) -> Callable[[], dict[str, float]]:
    """A function running ``build`` in a fresh folder: wall seconds and the compilers' CPU seconds."""

    def run() -> dict[str, float]:
        with tempfile.TemporaryDirectory() as tmp:
            wall, cpu = time.perf_counter(), _children_cpu()
            build(Path(tmp))
            return {"wall": time.perf_counter() - wall, "cpu": _children_cpu() - cpu}

    return run


def _build_ctypes(cache: Path) -> None:
    """``nn.native``'s first use for Backprop and QOA: the generic library and QOA's shape, into an empty cache."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    native.library.cache_clear()
    native._attention_library.cache_clear()
    try:
        native.library()
        native._attention_library(*_QOA_SHAPE)
    finally:
        native.library.cache_clear()
        native._attention_library.cache_clear()
        if before is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = before


def _build_cpp(folder: Path) -> Any:
    """The torch extension: ``steps.c`` as an object (QOA's shape as constants), the C++ binding linked to it."""
    from torch.utils.cpp_extension import load_inline

    d, h0, k = _QOA_SHAPE
    flags = [f for f in native._FLAGS if f != "-shared"] + ["-march=native"] * (native._cpu_tag() is not None)
    obj = folder / "steps.o"
    shape = [f"-DATTENTION_D={d}", f"-DATTENTION_H0={h0}", f"-DATTENTION_K={k}"]
    compiler = native._compiler()
    subprocess.run([compiler, *flags, *shape, "-c", "-o", str(obj), str(native._SOURCE)], check=True)
    return load_inline(
        f"cl_native_interface_{os.getpid()}_{next(_names)}",
        cpp_sources=[_BINDING],
        functions=["mlp", "attention"],
        extra_include_paths=[str(native._SOURCE.parent)],
        extra_cflags=["-O3"],
        extra_ldflags=[str(obj)],
        build_directory=str(folder),
    )


def _tensors(adam: FlatAdam, layers: list[nn.Linear], sizes: list[int], steps: int) -> tuple[Any, ...]:
    """The cpp binding's leading and trailing arguments: flat tensors, layout; first step and hyper-parameters."""
    h = adam.hyperparameters
    layout = native._layout(adam, layers, sizes)
    first = float(adam.advance(steps))
    head = (adam.flat, adam.grad, adam.moments["exp_avg"], adam.moments["exp_avg_sq"], *layout)
    return head, (first, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled)


def _cpp_steps(module: Any) -> tuple[Callable[..., Tensor], Callable[..., Tensor]]:
    """``nn.native.mlp_mse_steps`` and ``attention_mse_steps`` through the extension ``module``."""

    def mlp(layers: list[nn.Linear], adam: FlatAdam, xs: Tensor, ys: Tensor) -> Tensor:
        xs, ys = xs.contiguous().float(), ys.contiguous().float()
        preds = xs.new_empty(xs.shape[0], xs.shape[1], ys.shape[2])
        sizes = [layers[0].in_features, *(layer.out_features for layer in layers)]
        head, tail = _tensors(adam, layers, sizes, xs.shape[0])
        module.mlp(*head, xs, ys, preds, *tail)
        return preds

    def attention(first: nn.Linear, layers: list[nn.Linear], adam: FlatAdam, wx: Tensor, wy: Tensor, s: int) -> Tensor:
        wx, wy = wx.contiguous().float(), wy.contiguous().float()
        preds = wx.new_empty(wx.shape[0] - s, 1, wy.shape[1])
        sizes = [first.out_features, *(layer.out_features for layer in layers)]
        head, tail = _tensors(adam, [first, *layers], sizes, wx.shape[0] - s)
        module.attention(*head, wx, wy, s, preds, *tail)
        return preds

    return mlp, attention


def _per_step(run: Callable[[int], Any], points: int, chunk: int) -> Callable[[], float]:
    """A function timing ``run(start)`` over ``points`` points, ``chunk`` a call: µs per step, process CPU time."""

    def timed() -> float:
        start = time.process_time()
        for s in range(0, points, chunk):
            run(s)
        return (time.process_time() - start) / points * 1e6

    return timed


def _bp(steps: Callable[..., Tensor], points: int, chunk: int) -> Callable[[], float]:
    torch.manual_seed(0)
    net = MLP(20, 1, [40])
    x, y = torch.randint(0, 2, (points, 1, 20)).float(), torch.randn(points, 1, 1)
    adam = FlatAdam().bind(torch.optim.Adam(net.parameters(), lr=1e-4), list(net.parameters()))
    layers = list(net.layers)
    return _per_step(lambda s: steps(layers, adam, x[s : s + chunk], y[s : s + chunk]), points, chunk)


def _qoa(steps: Callable[..., Tensor], points: int, chunk: int, supports: int = 100) -> Callable[[], float]:
    torch.manual_seed(0)
    scorer = PairScorer(*_QOA_SHAPE[:1], 0, _QOA_SHAPE[1], 0)
    x, y = torch.randint(0, 2, (points + supports, 20)).float(), torch.randn(points + supports, 1)
    adam = FlatAdam().bind(torch.optim.Adam(scorer.parameters(), lr=1e-4, fused=True), list(scorer.parameters()))
    window = chunk + supports
    return _per_step(
        lambda s: steps(scorer.first, [scorer.out], adam, x[s : s + window], y[s : s + window], supports), points, chunk
    )


def _range(values: list[float], digits: int) -> str:
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Build both interfaces from clean caches and time the bare kernels through each, interleaved."""
    p = parser(__doc__, repeats=3)
    p.add_argument("--no-cpp", action="store_true", help="the ctypes rows only (no torch extension built)")
    bench = Bench.start("native_interface", p, argv)
    args = bench.args
    points, repeats = (200, 1) if args.small else (6000, args.repeats)
    cpp = not args.no_cpp and shutil.which("ninja") is not None
    builds = {"ctypes": _timed_build(_build_ctypes)}
    if cpp:
        builds["cpp_extension"] = _timed_build(_build_cpp)
    built = interleave(builds, repeats)
    with tempfile.TemporaryDirectory() as tmp:
        interfaces = {"ctypes": (native.mlp_mse_steps, native.attention_mse_steps)}
        if cpp:
            interfaces["cpp_extension"] = _cpp_steps(_build_cpp(Path(tmp)))
        variants = {}
        for chunk in (1000, 1):
            n = points if chunk > 1 else points // 3  # a call per step: fewer points, the same order of time
            for name, (mlp, attention) in interfaces.items():
                variants[f"bp T={chunk} {name}"] = _bp(mlp, n, min(chunk, n))
                variants[f"qoa T={chunk} {name}"] = _qoa(attention, n // 2, min(chunk, n // 2))
        for warm_up in variants.values():  # first calls: a library to load, a shape to build
            warm_up()
        stepped = interleave(variants, repeats)
    rows = []
    for name, runs in built.items():
        walls = [b["wall"] for b in runs]
        cpu = f"compilers' CPU {median(b['cpu'] for b in runs):.1f} s"
        rows.append([f"build {name}", "s (wall)", _range(walls, 1), round(median(walls), 1), cpu])
    for key, runs in stepped.items():
        ctypes_runs = stepped[key.replace("cpp_extension", "ctypes")]
        ratios = sorted(a / b for a, b in zip(runs, ctypes_runs, strict=True))
        ratio = "" if key.endswith("ctypes") else f"{ratios[0]:.2f}–{ratios[-1]:.2f} (median {median(ratios):.2f})"
        rows.append([f"step {key}", "µs/step", _range(runs, 2), round(median(runs), 2), ratio])
    columns = ["what", "unit", "range", "median", "/ ctypes (per round)"]
    notes = [f"{repeats} interleaved rounds; steps: {points:,} points at T=1,000, a third of them at T=1."]
    return bench.finish({"build": built, "us_per_step": stepped}, columns, rows, notes)


if __name__ == "__main__":
    main()
