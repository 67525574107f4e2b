"""Does ``torch.compile`` speed up QOA's training step? Eager and compiled steps, interleaved, on one machine.

A step is what ``QueryOnlyAttention.training_step`` spends on learning: the query loss over a support set
(``query_loss``: forward through the pair scorer, loss), its backward and one fused Adam step, at the paper's V1
size by default (1 query, 990 supports, scorer 108 → 100, 9 × 100 → 100, → 1). Both learners start from the same
weights; each round times ``--steps`` steps of each, alternating which goes first, so a shared machine's load
falls on both alike. Prints ms per step of each (on the CPU in CPU seconds of the process, so with one thread a
loaded machine's descheduling does not count), and the compiled/eager ratio of each round (median and range).

    python benchmarks/compile_step.py --threads 1           # V1 on the CPU, 5 rounds of 30 steps
    python benchmarks/compile_step.py --device cuda --mode reduce-overhead     # on a GPU (CUDA graphs)
    python benchmarks/compile_step.py --small               # tiny sizes (the smoke test; compilation dominates)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cl_lightning.learners import QueryOnlyAttention
from cl_lightning.nn.optim import prefer_fused


def _learner(args: argparse.Namespace, compiled: bool) -> tuple[QueryOnlyAttention, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = QueryOnlyAttention(
        support_size=args.supports + 10,
        hidden=args.hidden,
        num_hidden_layers=args.layers,
        compile=compiled,
        compile_mode=args.mode,
    ).to(args.device)
    return model, prefer_fused(torch.optim.Adam(model.parameters(), lr=1e-4))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _steps(model: QueryOnlyAttention, opt: torch.optim.Optimizer, data: tuple, n: int, device: str) -> float:
    """ms per step: wall time on CUDA, this process's CPU time on the CPU (what a loaded machine distorts least)."""
    qx, qy, sx, sy = data
    clock = time.perf_counter if device.startswith("cuda") else time.process_time
    _sync(device)
    start = clock()
    for _ in range(n):
        opt.zero_grad()
        model.query_loss(qx, qy, sx, sy).backward()
        opt.step()
    _sync(device)
    return (clock() - start) / n * 1e3


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    """Run the comparison and print it; returns the ms per step of each round."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--queries", type=int, default=1)
    p.add_argument("--supports", type=int, default=990)
    p.add_argument("--hidden", type=int, default=100)
    p.add_argument("--layers", type=int, default=9)
    p.add_argument("--mode", default="default", choices=["default", "reduce-overhead", "max-autotune"])
    p.add_argument("--small", action="store_true", help="100 supports, a 16-wide 2-layer scorer, 2 rounds of 3 steps")
    args = p.parse_args(argv)
    if args.small:
        args.supports, args.hidden, args.layers, args.rounds, args.steps = 100, 16, 2, 2, 3
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(1)
    data = (
        torch.rand(args.queries, 49, generator=gen),
        torch.randint(0, 10, (args.queries,), generator=gen),
        torch.rand(args.supports, 49, generator=gen),
        torch.randint(0, 10, (args.supports,), generator=gen),
    )
    data = tuple(t.to(args.device) for t in data)
    learners = {"eager": _learner(args, False), "compiled": _learner(args, True)}
    start = time.perf_counter()
    _steps(*learners["compiled"], data, 3, args.device)  # compile (and warm up)
    compile_s = time.perf_counter() - start
    _steps(*learners["eager"], data, 3, args.device)
    ms: dict[str, list[float]] = {"eager": [], "compiled": []}
    for r in range(args.rounds):
        for name in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
            ms[name].append(_steps(*learners[name], data, args.steps, args.device))
    ratios = [c / e for c, e in zip(ms["compiled"], ms["eager"], strict=True)]
    print(f"device {args.device}, {args.threads} threads, {args.queries} x {args.supports} pairs, mode {args.mode}")
    print(f"first compiled steps (compilation): {compile_s:.1f} s")
    for name, values in ms.items():
        print(f"{name:>8}: {statistics.median(values):.2f} ms/step (rounds {', '.join(f'{v:.2f}' for v in values)})")
    print(f"compiled / eager: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
    return ms


if __name__ == "__main__":
    main()
