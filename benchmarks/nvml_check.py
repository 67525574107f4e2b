"""The per-step cost of Lightning's ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` on a CPU run, and of the fix.

Every ``torch.optim`` Adam step asks ``torch.cuda.is_available()``; with the variable set (importing Lightning
sets it) a CUDA build of torch on a machine without a driver tries to load NVML each time and fails.
``cl_lightning.nn.optim.drop_unloadable_nvml_check`` (run at every fit's start) unsets it where NVML cannot load.
This times a bare eager loop of the slowly-changing-regression Backprop step (MLP 20 -> 40 -> 1, one point, MSE,
Adam 1e-4, PyTorch's default and fused kernels) with the variable set and unset, interleaved, in process CPU time
on one thread, plus ``torch.cuda.is_available()`` alone.

    python -m benchmarks.nvml_check [--repeats 5] [--steps 3000] [--out docs/results/nvml] [--small]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import lightning  # noqa: F401  (sets the variable, as in every run)
import torch
from torch import nn

from benchmarks.harness import Bench, interleave, parser
from cl_lightning.nn.optim.adam_kernel import NVML_CHECK


def _loop(fused: bool) -> Callable[[int], float]:
    """A bare one-point training loop; returns a function timing ``n`` steps (µs per step, process CPU time)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 40), nn.ReLU(), nn.Linear(40, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, fused=fused or None)
    x, y = torch.rand(1000, 1, 20), torch.rand(1000, 1, 1)

    def run(n: int) -> float:
        start = time.process_time()
        for i in range(n):
            loss = (net(x[i % 1000]) - y[i % 1000]).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return (time.process_time() - start) / n * 1e6

    return run


def _is_available(n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        torch.cuda.is_available()
    return (time.process_time() - start) / n * 1e6


def _timed(variable: bool, fn: Callable[[int], float], n: int) -> float:
    if variable:
        os.environ[NVML_CHECK] = "1"
    else:
        os.environ.pop(NVML_CHECK, None)
    return fn(n)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time each case with the variable set and unset, interleaved; return µs per call by case and setting."""
    p = parser(__doc__, repeats=5)
    p.add_argument("--steps", type=int, default=3000, help="calls per timing")
    bench = Bench.start("nvml_check", p, argv)
    repeats, steps = (2, 200) if bench.args.small else (bench.args.repeats, bench.args.steps)
    before = os.environ.get(NVML_CHECK)
    cases = {"is_available()": _is_available, "adam step": _loop(False), "fused adam step": _loop(True)}
    for fn in cases.values():  # warm up: first calls, allocator, optimiser state
        fn(50)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for case, fn in cases.items():
            timed = interleave(
                {"set": lambda fn=fn: _timed(True, fn, steps), "unset": lambda fn=fn: _timed(False, fn, steps)}, repeats
            )
            results[case] = timed
    finally:
        if before is None:
            os.environ.pop(NVML_CHECK, None)
        else:
            os.environ[NVML_CHECK] = before
    rows = []
    for case, r in results.items():
        s, u = sorted(r["set"]), sorted(r["unset"])
        median_set, median_unset = s[len(s) // 2], u[len(u) // 2]
        rows.append(
            [
                case,
                f"{s[0]:.1f}-{s[-1]:.1f}",
                f"{u[0]:.1f}-{u[-1]:.1f}",
                median_set - median_unset,
                median_set / median_unset,
            ]
        )
    note = f"µs per call, process CPU time, {repeats} interleaved rounds of {steps} calls."
    return bench.finish(
        {"us_per_call": results}, ["case", "variable set", "unset", "saved (median)", "ratio"], rows, [note]
    )


if __name__ == "__main__":
    main()
