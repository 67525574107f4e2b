"""Does the context memory hold concepts, or only pairs? A probe of property P1 (issue 24).

McDermott, Heath Jr., Parhi (2026) ask the context memory to be *expressive*: to hold what the context means, not
only raw recall of what it wrote. ``AssociativeRecall(rule=True)`` makes that measurable: each task writes n
noisy pairs (key in R^16, value in 10 classes) whose values follow the task's rule, value = argmax(A_t key) for a
random linear map A_t drawn per task, and after the task every learner is read, from its own memory only, on

- *written keys*: the task's n keys (clean): recall of what was written;
- *unseen keys*: 128 fresh keys of the same task, never written, labelled by the same rule: a memory that captured
  the rule answers them, one that stores pairs answers them only as far as a nearby written key shares the value.

Learners at about 5,120 bytes of context memory (as ``lifelong_reuse``): the delta rule (d_k 128; also with its key
path frozen at its random init, so that only the fast state learns), the gated delta rule (d_k 128), Hebbian linear
attention (d_k 128), TTT-Linear (d_k 36), StableKeyMemory (one state of fixed sign keys, d_k 128), and kNN (k = 1)
and QOA on FIFO buffers of 64 rows; and two references computed on the task's own training examples, not learners:
*least squares* (the one-hot targets regressed linearly on the keys: what capturing a linear rule from these
examples gives) and *nearest written pair* (1-NN over the task's n keys: pairs only, unbounded). n in {8, 32, 128};
10 tasks of 256 examples (chunks of 32), scored over tasks 2-9; mean ± std over seeds.

    OMP_NUM_THREADS=1 python -m benchmarks.lifelong_rule [--small] [--repeats 5] [--out DIR]

writes ``rule.json``, ``rule.md`` and the harness's ``lifelong_rule.json`` / ``.md`` under ``--out`` (default
docs/results/lifelong_icl).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from typing import Any

import torch

from benchmarks import lifelong_icl as icl
from benchmarks.harness import parser
from cl_lightning.data import AssociativeRecall
from cl_lightning.data.stream import TaskStream
from cl_lightning.learners import StableKeyMemory
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.memory.accounting import memory_bytes
from cl_lightning.nn.fast_weights import DeltaRule, GatedDeltaRule, LinearAttention, TTTLinear

START = 2  # tasks scored from here on (the slow weights have seen two rules)
COLUMNS = ["written pairs n", "learner", "context bytes", "written keys", "unseen keys (rule)"]
FROZEN = "delta rule, encoder frozen at init (d_k 128)"  # only the fast state learns
REFERENCES = ("least squares on the task's examples", "nearest written pair (1-NN, unbounded)")


def learner_specs(hidden: list[int]) -> list[icl.Spec]:
    """The parametric rules, StableKeyMemory and the two buffers, each at about 5,120 context bytes."""

    def stable_keys(stream: TaskStream) -> ContinualLearner:
        return StableKeyMemory(
            input_shape=stream.input_shape, num_outputs=stream.num_outputs, hidden_sizes=hidden, routes=1, key_dim=128
        )

    buffers = {s.name: s for s in icl.nonparametric_specs(hidden)}
    return [
        icl.parametric("delta rule (d_k 128)", hidden, rule=DeltaRule(), key_dim=128),
        icl.parametric(FROZEN, hidden, rule=DeltaRule(), key_dim=128, encoder_training="frozen_random"),
        icl.parametric("gated delta rule (d_k 128)", hidden, rule=GatedDeltaRule(), key_dim=128),
        icl.parametric("linear attention, Hebbian (d_k 128)", hidden, rule=LinearAttention(), key_dim=128),
        icl.parametric("TTT-Linear (d_k 36)", hidden, rule=TTTLinear(), key_dim=36),
        icl.Spec("StableKeyMemory (1 state, d_k 128)", stable_keys),
        replace(buffers["knn"], name="kNN, k = 1 (FIFO, 64 rows)"),
        replace(buffers["qoa"], name="QOA (FIFO, 64 rows)"),
    ]


def _accuracy(logits: torch.Tensor, target: torch.Tensor) -> float:
    return (logits.argmax(-1) == target).float().mean().item()


def references(stream: AssociativeRecall, task: int) -> list[float]:
    """The two references' unseen-key accuracy on ``task`` (see the module docstring)."""
    data, (keys, values) = stream.task(task), stream.items(task)
    targets = torch.nn.functional.one_hot(data.train_y, stream.num_outputs).float()
    weights = torch.linalg.lstsq(data.train_x, targets).solution  # (D, C)
    nearest = values[torch.cdist(data.query_x, keys).argmin(-1)]
    return [_accuracy(data.query_x @ weights, data.query_y), (nearest == data.query_y).float().mean().item()]


def run(spec: icl.Spec, stream: AssociativeRecall, seed: int) -> dict[str, float]:
    """One learner over the rule stream: mean accuracy on written and unseen keys after each scored task."""
    torch.manual_seed(seed)
    learner = spec.make(stream)
    runner = icl.Runner(learner, spec.lr)
    written, unseen = [], []
    for task in range(stream.num_tasks):
        runner.begin_task(task)
        for i in range(stream.num_chunks):
            runner.step(stream.chunk(task, i), i)
        if task >= START:
            (keys, values), data = stream.items(task), stream.task(task)
            with torch.no_grad():
                written.append(_accuracy(learner(keys), values))
                unseen.append(_accuracy(learner(data.query_x), data.query_y))
    row = icl.row_bytes(stream) if hasattr(learner, "buffer") else None
    return {
        "written": statistics.fmean(written),
        "unseen": statistics.fmean(unseen),
        "bytes": memory_bytes(learner, row).budget,  # rows held, or state + fixed projection
    }


def _row(items: int, name: str, nbytes: int | None, written: list[float], unseen: list[float]) -> dict[str, Any]:
    row: dict[str, Any] = {"items": items, "learner": name, "bytes": nbytes}
    for key, values in (("written", written), ("unseen", unseen)):
        row[key] = statistics.fmean(values) if values else float("nan")
        row[f"{key}_std"] = statistics.pstdev(values) if len(values) > 1 else 0.0
    return row


def main(argv: list[str] | None = None) -> dict:
    """Every learner and both references at each n over ``--repeats`` seeds; JSON and a Markdown table."""
    bench = icl.start("lifelong_rule", parser(__doc__, repeats=5, repeats_help="seeds", out=icl.RESULTS), argv)
    args = bench.args
    tasks, hidden, sizes = 10, [128], (8, 32, 128)
    if args.small:
        tasks, hidden, sizes, args.repeats = 4, [32], (8,), 1
    started, rows = time.perf_counter(), []
    for items in sizes:
        streams = [
            AssociativeRecall(tasks, items, 10, 16, 256, 128, 32, rule=True, seed=seed) for seed in range(args.repeats)
        ]
        refs = [[references(s, t) for t in range(START, tasks)] for s in streams]  # (seeds, tasks, 2)
        for i, name in enumerate(REFERENCES):
            rows.append(_row(items, name, None, [], [statistics.fmean(r[i] for r in seed) for seed in refs]))
        for spec in learner_specs(hidden):
            runs = [run(spec, stream, seed) for seed, stream in enumerate(streams)]
            rows.append(_row(items, spec.name, runs[0]["bytes"], [r["written"] for r in runs],
                             [r["unseen"] for r in runs]))  # fmt: skip
        for r in rows[-len(REFERENCES) - len(learner_specs(hidden)) :]:
            print(f"n {items:>3} {r['learner']:<40} written {r['written']:.3f}  unseen {r['unseen']:.3f}", flush=True)
    cells = [
        [r["items"], r["learner"], "-" if r["bytes"] is None else f"{r['bytes']:,}"]
        + ["-" if r[k] != r[k] else f"{r[k]:.3f} ± {r[f'{k}_std']:.3f}" for k in ("written", "unseen")]
        for r in rows
    ]
    table = "\n".join(icl.markdown_table(COLUMNS, "rlrrr", cells))
    result = {"rows": rows, "repeats": args.repeats, "seconds": time.perf_counter() - started}
    (args.out / "rule.json").write_text(json.dumps(result, indent=1))
    (args.out / "rule.md").write_text(table + "\n")
    return bench.finish(result, COLUMNS, cells, [f"total {result['seconds'] / 60:.1f} min; results in {args.out}"])


if __name__ == "__main__":
    main()
