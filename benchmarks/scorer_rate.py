"""The QOA scorer's evaluation rate against a 2048² matmul, before and after blocking, in CPU seconds.

One quarter of a paper-size episode (500 queries × 1,000 supports through the 9 hidden 100 × 100 layers, 90 GFLOP)
through the old path (queries in chunks of ``pair_budget`` = 65,536 pairs through the modules) and through
``PairScorer.score_blocked``, interleaved ``--repeats`` times, timed in this process's CPU seconds (a shared
machine disturbs them less than wall seconds).

    python -m benchmarks.scorer_rate [--threads 1] [--repeats 2]
    python -m benchmarks.scorer_rate --small    # 50 queries x 100 supports, a 512² matmul, once (the smoke test)
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.harness import Bench, clock, interleave, matmul_gflops, parser
from cl_lightning.nn.scorers import PairScorer, tuned_block_pairs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """GFLOP per CPU second of the matmul yardstick and of both paths, per round."""
    bench = Bench.start("scorer_rate", parser(__doc__, repeats=2), argv)
    args = bench.args
    queries, supports, n = (50, 100, 512) if args.small else (500, 1000, 2048)
    torch.manual_seed(0)
    scorer = PairScorer(49, 10)
    qx, sx, sy = torch.rand(queries, 49), torch.rand(supports, 49), torch.randint(0, 10, (supports,))
    flops = queries * supports * (9 * 2 * 100 * 100 + 2 * 100)

    def old() -> torch.Tensor:
        a = scorer.support_part(sx, sy)
        step = scorer.pair_budget // supports
        return torch.cat([scorer.tail(scorer.query_part(q)[:, None, :] + a[None]) for q in qx.split(step)])

    def rate(fn: Any) -> float:
        with torch.no_grad(), clock() as t:
            fn()
        return flops / max(t.cpu, 1e-9) / 1e9

    block = tuned_block_pairs(100, 9, torch.device("cpu"), torch.float32)
    rates = interleave(
        {
            "matmul": lambda: matmul_gflops(n=n)[1],
            "before": lambda: rate(old),
            "blocked": lambda: rate(lambda: scorer(qx, sx, sy)),
        },
        1 if args.small else args.repeats,
    )
    rows = [[f"matmul {n}²" if name == "matmul" else name, *values] for name, values in rates.items()]
    columns = ["path", *(f"GFLOP per CPU s, round {r + 1}" for r in range(len(rates["matmul"])))]
    return bench.finish(
        {"block_pairs": block, "gflop_per_cpu_s": rates}, columns, rows, [f"measured block: {block} pairs"]
    )


if __name__ == "__main__":
    main()
