"""Does ``torch.compile`` speed up QOA's training step? Eager and compiled steps, interleaved, on one machine.

A step is what ``QueryOnlyAttention.training_step`` spends on learning: the query loss over a support set
(``query_loss``: forward through the pair scorer, loss), its backward and one fused Adam step, at the paper's V1
size by default (1 query, 990 supports, scorer 108 → 100, 9 × 100 → 100, → 1). Both learners start from the same
weights; each of ``--repeats`` rounds times ``--steps`` steps of each, alternating which goes first, so a
shared machine's load falls on both alike. Prints ms per step of each (on the CPU in CPU seconds of the process,
so with one thread a loaded machine's descheduling does not count), and the compiled/eager ratio of each round
(median and range).

    python -m benchmarks.compile_step --threads 1           # V1 on the CPU, 5 rounds of 30 steps
    python -m benchmarks.compile_step --device cuda --mode reduce-overhead     # on a GPU (CUDA graphs)
    python -m benchmarks.compile_step --small               # tiny sizes (the smoke test; compilation dominates)
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from benchmarks.harness import Bench, clock, interleave, parser
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


def _steps(model: QueryOnlyAttention, opt: torch.optim.Optimizer, data: tuple, n: int, device: str) -> float:
    """ms per step: wall time on CUDA, this process's CPU time on the CPU (what a loaded machine distorts least)."""
    qx, qy, sx, sy = data
    with clock(device) as t:
        for _ in range(n):
            opt.zero_grad()
            model.query_loss(qx, qy, sx, sy).backward()
            opt.step()
    return (t.wall if device.startswith("cuda") else t.cpu) / n * 1e3


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison; the result holds the ms per step of each round and the compiled/eager ratios."""
    p = parser(__doc__, threads=2, repeats=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--queries", type=int, default=1)
    p.add_argument("--supports", type=int, default=990)
    p.add_argument("--hidden", type=int, default=100)
    p.add_argument("--layers", type=int, default=9)
    p.add_argument("--mode", default="default", choices=["default", "reduce-overhead", "max-autotune"])
    bench = Bench.start("compile_step", p, argv)
    args = bench.args
    if args.small:  # 100 supports, a 16-wide 2-layer scorer, 2 rounds of 3 steps
        args.supports, args.hidden, args.layers, args.repeats, args.steps = 100, 16, 2, 2, 3
    gen = torch.Generator().manual_seed(1)
    data = (
        torch.rand(args.queries, 49, generator=gen),
        torch.randint(0, 10, (args.queries,), generator=gen),
        torch.rand(args.supports, 49, generator=gen),
        torch.randint(0, 10, (args.supports,), generator=gen),
    )
    data = tuple(t.to(args.device) for t in data)
    learners = {"eager": _learner(args, False), "compiled": _learner(args, True)}
    with clock(args.device) as compiling:
        _steps(*learners["compiled"], data, 3, args.device)  # compile (and warm up)
    _steps(*learners["eager"], data, 3, args.device)
    ms = interleave(
        {name: lambda lr=lr: _steps(*lr, data, args.steps, args.device) for name, lr in learners.items()}, args.repeats
    )
    ratios = [c / e for c, e in zip(ms["compiled"], ms["eager"], strict=True)]
    rows = [[name, statistics.median(v), ", ".join(f"{x:.2f}" for x in v)] for name, v in ms.items()]
    notes = [
        f"device {args.device}, {args.queries} x {args.supports} pairs, mode {args.mode}; ms per step in "
        f"{'wall' if args.device.startswith('cuda') else 'CPU'} seconds",
        f"first compiled steps (compilation): {compiling.wall:.1f} s",
        f"compiled / eager: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}",
    ]
    result = {"ms": ms, "ratios": ratios, "compile_s": compiling.wall}
    return bench.finish(result, ["step", "median ms/step", "rounds"], rows, notes)


if __name__ == "__main__":
    main()
