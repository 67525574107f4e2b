"""Streams that reuse keys: where do the first open question's regularisers pay? (issue 24)

McDermott, Heath Jr., Parhi (2026) pose the online objective as an open question (Q1): if the goal is not perfect
key -> value memorisation, regularisation — forget gates, weight decay, several heads (multi-head linear attention
"acts as an implicit regulariser") — should keep the state from over-fitting the immediate context. On the
scorecard's stream no key is ever reused, so those levers could only cost. Here keys are reused
(``AssociativeRecall``, 8 associations, keys in R^128, chance 0.10):

- **partial revision** (``revise=True``, ``change_fraction`` f): each task gives a share f of the keys a new value;
  scored after each task on the current map's queries — all of them (*forward*), those of the keys revised at
  this task (*revised*: the old value must be forgotten) and the share of revised queries still answered with the
  old value (*stale*);
- **recurring maps** (``recur_every`` k): every map returns after k tasks; *return recall* is the live accuracy on
  a returning map's queries *before* it is shown again, at its first return (tasks k .. 2k-1) and its last
  (the last k tasks), so a rise measures consolidation over repeated exposures.

Learners: the delta rule (d_k 128) and its Q1 levers at the same 5,120 state bytes — forget gate (gated delta rule),
weight decay (Titans' retention gate, momentum 0.01, d_k 64), 4 heads x d_k 32 — and the Hebbian pair, linear
attention and its decayed form, where forgetting is the only way to replace a value. Mean ± std over seeds.

    OMP_NUM_THREADS=1 python -m benchmarks.lifelong_reuse [--small] [--repeats 5] [--out DIR]

writes ``reuse.json``, ``reuse.md`` and the harness's ``lifelong_reuse.json`` / ``.md`` under ``--out`` (default
docs/results/lifelong_icl).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch

from benchmarks import lifelong_icl as icl
from benchmarks.harness import parser
from cl_lightning.data import AssociativeRecall

METRICS = ("forward", "revised", "stale", "return_first", "return_last")
COLUMNS = ["stream", "lever", "forward", "revised keys", "stale answers", "return recall, first", "last"]


def lever_specs(hidden: list[int]) -> list[tuple[str, Any]]:
    """(label, spec): the delta rule, its Q1 levers at 5,120 state bytes, and the Hebbian pair."""
    p = icl.parametric
    return [
        ("delta rule (d_k 128)", p("delta_rule", hidden, rule="delta_rule", key_dim=128)),
        ("Q1 forget gate (gated delta rule)", p("gdn", hidden, rule="gated_delta_rule", key_dim=128)),
        (
            "Q1 weight decay (titans, mu0 0.01, d_k 64)",
            p("wd", hidden, rule="titans", key_dim=64, momentum_init=0.01, mini_batch_size=1),
        ),
        ("Q1 4 heads x d_k 32", p("heads4", hidden, rule="delta_rule", key_dim=32, num_heads=4)),
        ("linear attention (Hebbian)", p("linear_attn", hidden, rule="linear_attn", key_dim=128)),
        ("Q1 forget gate on linear attention (decay)", p("decay", hidden, rule="decay", key_dim=128)),
    ]


def _accuracy(pred: torch.Tensor, target: torch.Tensor) -> float:
    return (pred == target).float().mean().item() if len(target) else float("nan")


def _cell(mean: float, std: float) -> str:
    return "-" if mean != mean else f"{mean:.3f} ± {std:.3f}"  # NaN: the stream has no such score


def run(spec: Any, stream: AssociativeRecall, seed: int) -> dict[str, float]:
    """One learner over one reuse stream: the metrics of the module docstring (NaN where the stream has none)."""
    torch.manual_seed(seed)
    learner = spec.make(stream)
    runner = icl.Runner(learner, spec.lr)
    k, start = stream.recur_every, 5  # revision scored from task 5 on (the map has settled)
    scores: dict[str, list[float]] = {m: [] for m in METRICS}
    for task in range(stream.num_tasks):
        data, slots = stream.task(task), stream.slots(task)[stream.train_size :]
        if k is not None and task >= k and (task < 2 * k or task >= stream.num_tasks - k):
            with torch.no_grad():
                pred = learner(data.query_x).argmax(-1)
            scores["return_first" if task < 2 * k else "return_last"].append(_accuracy(pred, data.query_y))
        runner.begin_task(task)
        for i in range(stream.num_chunks):
            runner.step(stream.chunk(task, i), i)
        if task < start:
            continue
        with torch.no_grad():
            pred = learner(data.query_x).argmax(-1)
        scores["forward"].append(_accuracy(pred, data.query_y))
        if stream.revise:
            revised = (stream.born(task) == task)[slots]
            old = stream.items(task - 1)[1][slots]
            scores["revised"].append(_accuracy(pred[revised], data.query_y[revised]))
            scores["stale"].append(_accuracy(pred[revised], old[revised]))
    return {m: statistics.fmean(v) if v else float("nan") for m, v in scores.items()}


def main(argv: list[str] | None = None) -> dict:
    """Every lever on every reuse stream over ``--repeats`` seeds; JSON and a Markdown table under ``--out``."""
    bench = icl.start("lifelong_reuse", parser(__doc__, repeats=5, repeats_help="seeds", out=icl.RESULTS), argv)
    args = bench.args
    tasks, dim, train, hidden = 25, 128, 256, [128]
    if args.small:
        tasks, dim, train, hidden, args.repeats = 8, 32, 64, [32], 1
    streams = {
        "revise f 0.25": {"revise": True, "change_fraction": 0.25},
        "revise f 1.0": {"revise": True, "change_fraction": 1.0},
        "recur k 5": {"recur_every": 3 if args.small else 5},
    }
    started, rows = time.perf_counter(), []
    for stream_name, kwargs in streams.items():
        for label, spec in lever_specs(hidden):
            runs = [
                run(spec, AssociativeRecall(tasks, 8, 10, dim, train, 128, 32, seed=seed, **kwargs), seed)
                for seed in range(args.repeats)
            ]
            row: dict[str, Any] = {"stream": stream_name, "lever": label}
            for m in METRICS:
                values = [r[m] for r in runs]
                finite = [v for v in values if v == v]  # NaN where the stream has no such score
                row[m] = statistics.fmean(finite) if finite else float("nan")
                row[f"{m}_std"] = statistics.pstdev(finite) if len(finite) > 1 else 0.0
            rows.append(row)
            print(f"{stream_name:<14}{label:<44}" + " ".join(f"{m} {row[m]:.3f}" for m in METRICS), flush=True)
    cells = [[r["stream"], r["lever"], *(_cell(r[m], r[f"{m}_std"]) for m in METRICS)] for r in rows]
    table = "\n".join(icl.markdown_table(COLUMNS, "llrrrrr", cells))
    result = {"rows": rows, "seconds": time.perf_counter() - started, "repeats": args.repeats}
    (args.out / "reuse.json").write_text(json.dumps(result, indent=1))
    (args.out / "reuse.md").write_text(table + "\n")
    return bench.finish(result, COLUMNS, cells, [f"total {result['seconds'] / 60:.1f} min; results in {args.out}"])


if __name__ == "__main__":
    main()
