"""The per-step cost of Lightning's ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` on a CPU run, and of the fix.

Every ``torch.optim`` Adam step asks ``torch.cuda.is_available()``; with the variable set (importing Lightning
sets it) a CUDA build of torch on a machine without a driver tries to load NVML each time and fails.
``cl_lightning.nn.optim.drop_unloadable_nvml_check`` (run at every fit's start) unsets it where NVML cannot load.
This times a bare eager loop of the slowly-changing-regression Backprop step (MLP 20 -> 40 -> 1, one point, MSE,
Adam 1e-4, PyTorch's default and fused kernels) with the variable set and unset, interleaved, in process CPU time
on one thread, plus ``torch.cuda.is_available()`` alone.

    python benchmarks/nvml_check.py [--repeats 5] [--steps 3000] [--out nvml.json] [--small]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import lightning  # noqa: F401  (sets the variable, as in every run)
import torch
from torch import nn

from cl_lightning.nn.optim import NVML_CHECK


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


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    """Time each case with the variable set and unset, interleaved; print and return µs per step by case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the measurements as JSON")
    parser.add_argument("--small", action="store_true", help="2 repeats of 200 steps (the smoke test)")
    args = parser.parse_args(argv)
    repeats, steps = (2, 200) if args.small else (args.repeats, args.steps)
    torch.set_num_threads(args.threads)
    before = os.environ.get(NVML_CHECK)
    cases = {"is_available()": _is_available, "adam step": _loop(False), "fused adam step": _loop(True)}
    for fn in cases.values():  # warm up: first calls, allocator, optimiser state
        fn(50)
    results: dict[str, dict[str, list[float]]] = {c: {"set": [], "unset": []} for c in cases}
    try:
        for _ in range(repeats):
            for case, fn in cases.items():
                for variable in (True, False):
                    results[case]["set" if variable else "unset"].append(_timed(variable, fn, steps))
    finally:
        if before is None:
            os.environ.pop(NVML_CHECK, None)
        else:
            os.environ[NVML_CHECK] = before
    print(f"µs per call, process CPU time, {args.threads} thread(s), {repeats} x {steps}, interleaved")
    print(f"{'case':<18}{'variable set':>18}{'unset':>18}{'saved':>10}{'ratio':>8}")
    for case, r in results.items():
        s, u = sorted(r["set"]), sorted(r["unset"])
        ratio = s[len(s) // 2] / u[len(u) // 2]
        saved = s[len(s) // 2] - u[len(u) // 2]
        print(f"{case:<18}{s[0]:>8.1f}-{s[-1]:<9.1f}{u[0]:>8.1f}-{u[-1]:<9.1f}{saved:>10.1f}{ratio:>8.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
