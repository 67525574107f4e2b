"""The QOA scorer's evaluation rate against a 2048² matmul, before and after blocking, in CPU seconds.

One quarter of a paper-size episode (500 queries × 1,000 supports through the 9 hidden 100 × 100 layers, 90 GFLOP)
through the old path (queries in chunks of ``pair_budget`` = 65,536 pairs through the modules) and through
``PairScorer.score_blocked``, interleaved ``--repeats`` times, timed in this process's CPU seconds (a shared
machine disturbs them less than wall seconds).

    python benchmarks/scorer_rate.py [--threads 1] [--repeats 2]
    python benchmarks/scorer_rate.py --small    # 50 queries x 100 supports, a 512² matmul, once (the smoke test)
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from cl_lightning.nn.scorers import PairScorer, tuned_block_pairs


def main(argv: list[str] | None = None) -> None:
    """Print GFLOP per CPU second of the matmul and of both paths, per repeat."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="50 queries x 100 supports, a 512² matmul, one repeat")
    args = parser.parse_args(argv)
    queries, supports, n = (50, 100, 512) if args.small else (500, 1000, 2048)
    if args.small:
        args.repeats = 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    scorer = PairScorer(49, 10)
    qx, sx, sy = torch.rand(queries, 49), torch.rand(supports, 49), torch.randint(0, 10, (supports,))
    flops = queries * supports * (9 * 2 * 100 * 100 + 2 * 100)

    def old() -> torch.Tensor:
        a = scorer.support_part(sx, sy)
        step = scorer.pair_budget // supports
        return torch.cat([scorer.tail(scorer.query_part(q)[:, None, :] + a[None]) for q in qx.split(step)])

    def matmul() -> float:
        a, b = torch.randn(n, n), torch.randn(n, n)
        c = a @ b
        start = time.process_time()
        for _ in range(4):
            torch.mm(a, b, out=c)
        return 4 * 2 * n**3 / (time.process_time() - start) / 1e9

    block = tuned_block_pairs(100, 9, torch.device("cpu"), torch.float32)
    print(f"measured block: {block} pairs; load average {os.getloadavg()[0]:.1f}")
    with torch.no_grad():
        for _ in range(args.repeats):
            rates = {f"matmul {n}²": matmul()}
            for name, fn in (("before", old), ("blocked", lambda: scorer(qx, sx, sy))):
                start = time.process_time()
                fn()
                rates[name] = flops / (time.process_time() - start) / 1e9
            shown = ", ".join(f"{k} {v:.1f}" for k, v in rates.items())
            print(f"GFLOP per CPU second: {shown}; load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
