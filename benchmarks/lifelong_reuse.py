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
  (the last k tasks), so a rise measures consolidation over repeated exposures; *first visit* is the accuracy on
  the same queries right after the map's first showing (tasks 0 .. k-1), what the first return is read against,
  and *before first visit* the accuracy on a map not yet shown (tasks 1 .. k-1), what nothing kept gives.

``--streams PermutedMNIST`` runs the recurring case on Permuted MNIST instead (``PermutedMNIST(recur_every=5)``:
25 tasks of 500 7x7 images in chunks of 100, 200 queries, encoder [256], Adam 3e-4 as the encoder study), where a
returning task is a classifier, not a handful of associations, and adds StableKeyMemory's two goal settings
(``configs/suites/lifelong_goals_*.yaml``) and two at about the levers' state bytes (one state of d_k 128, 5,324 B
of state; eight routed states of d_k 12, 5,416 B); the bytes reported also count each one's fixed projection R.

Learners: the delta rule (d_k 128) and its Q1 levers at the same 5,120 state bytes — forget gate (gated delta rule),
weight decay (Titans' retention gate, momentum 0.01, d_k 64), 4 heads x d_k 32 — and the Hebbian pair, linear
attention and its decayed form, where forgetting is the only way to replace a value; and StableKeyMemory with one
state of d_k 128 (fixed sign keys; 5,640 B with its centroid). Mean ± std over seeds.

    OMP_NUM_THREADS=1 python -m benchmarks.lifelong_reuse [--small] [--repeats 5] [--streams ...] [--out DIR]

writes ``reuse.json``, ``reuse.md`` (``reuse_PermutedMNIST.*`` for that stream) and the harness's
``lifelong_reuse.json`` / ``.md`` under ``--out`` (default docs/results/lifelong_icl).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import lifelong_icl as icl
from benchmarks.harness import parser
from cl_lightning.data import AssociativeRecall, PermutedMNIST
from cl_lightning.data.stream import TaskStream
from cl_lightning.learners import StableKeyMemory
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.memory.accounting import memory_bytes
from cl_lightning.nn.fast_weights import DecayLinearAttention, DeltaRule, GatedDeltaRule, LinearAttention, Titans

GOALS = {"sign keys, 1 state (d_k 1,000)": (1, 1000), "sign keys, 8 routed states (d_k 112)": (8, 112)}  # §3's
MATCHED = {"sign keys, 1 state (d_k 128)": (1, 128), "sign keys, 8 routed states (d_k 12)": (8, 12)}  # ~5 KB
METRICS = ("forward", "revised", "stale", "before_first", "first_visit", "return_first", "return_last")
COLUMNS = ["stream", "lever", "state bytes", "forward", "revised keys", "stale answers", "before first visit",
           "first visit", "return recall, first", "last"]  # fmt: skip


def lever_specs(hidden: list[int]) -> list[tuple[str, Any]]:
    """(label, spec): the delta rule, its Q1 levers at 5,120 state bytes, and the Hebbian pair."""
    p = icl.parametric
    return [
        ("delta rule (d_k 128)", p("delta_rule", hidden, rule=DeltaRule(), key_dim=128)),
        ("Q1 forget gate (gated delta rule)", p("gdn", hidden, rule=GatedDeltaRule(), key_dim=128)),
        (
            "Q1 weight decay (titans, mu0 0.01, d_k 64)",
            p("wd", hidden, key_dim=64, rule=Titans(momentum_init=0.01, mini_batch_size=1)),
        ),
        ("Q1 4 heads x d_k 32", p("heads4", hidden, rule=DeltaRule(), key_dim=32, num_heads=4)),
        ("linear attention (Hebbian)", p("linear_attn", hidden, rule=LinearAttention(), key_dim=128)),
        ("Q1 forget gate on linear attention (decay)", p("decay", hidden, rule=DecayLinearAttention(), key_dim=128)),
    ]


def stable_key_memory(label: str, hidden: list[int], lr: float, shape: tuple[int, int]) -> icl.Spec:
    """A StableKeyMemory spec of ``shape`` = (routes, d_k) (formerly ``benchmarks.lifelong_goals.spec``)."""
    routes, key_dim = shape

    def make(stream: TaskStream) -> ContinualLearner:
        return StableKeyMemory(input_shape=stream.input_shape, num_outputs=stream.num_outputs, hidden_sizes=hidden,
                               routes=routes, key_dim=key_dim)  # fmt: skip

    return icl.Spec(label, make, lr=lr)


def _accuracy(pred: torch.Tensor, target: torch.Tensor) -> float:
    return (pred == target).float().mean().item() if len(target) else float("nan")


def _cell(mean: float, std: float) -> str:
    return "-" if mean != mean else f"{mean:.3f} ± {std:.3f}"  # NaN: the stream has no such score


def _read_before(task: int, k: int | None, num_tasks: int) -> str | None:
    """The score a recurring stream's task is read for *before* it is shown: a map not yet seen (tasks 1 .. k-1), its
    first return (k .. 2k-1), its last (the last k tasks); None otherwise."""
    if k is None or task == 0:
        return None
    if task < k:
        return "before_first"
    if task < 2 * k:
        return "return_first"
    return "return_last" if task >= num_tasks - k else None


def run(spec: Any, stream: TaskStream, seed: int) -> dict[str, float]:
    """One learner over one reuse stream: the metrics of the module docstring (NaN where the stream has none) and
    its context bytes."""
    torch.manual_seed(seed)
    learner = spec.make(stream)
    runner = icl.Runner(learner, spec.lr)
    k, start = stream.recur_every, 5  # revision scored from task 5 on (the map has settled)
    revise = getattr(stream, "revise", False)  # Permuted MNIST never revises
    scores: dict[str, list[float]] = {m: [] for m in METRICS}
    for task in range(stream.num_tasks):
        data = stream.task(task)
        before = _read_before(task, k, stream.num_tasks)
        if before is not None:
            with torch.no_grad():
                pred = learner(data.query_x).argmax(-1)
            scores[before].append(_accuracy(pred, data.query_y))
        runner.begin_task(task)
        for i in range(stream.num_chunks):
            runner.step(stream.chunk(task, i), i)
        with torch.no_grad():
            pred = learner(data.query_x).argmax(-1)
        if k is not None and task < k:
            scores["first_visit"].append(_accuracy(pred, data.query_y))
        if task < start:
            continue
        scores["forward"].append(_accuracy(pred, data.query_y))
        if revise:
            slots = stream.slots(task)[stream.train_size :]
            revised = (stream.born(task) == task)[slots]
            old = stream.items(task - 1)[1][slots]
            scores["revised"].append(_accuracy(pred[revised], data.query_y[revised]))
            scores["stale"].append(_accuracy(pred[revised], old[revised]))
    return {m: statistics.fmean(v) if v else float("nan") for m, v in scores.items()} | {
        "bytes": memory_bytes(learner).budget  # state, routing and fixed projection (memory.accounting)
    }


def stream_specs(args: Any) -> dict[str, tuple[Callable[[int], TaskStream], list[tuple[str, Any]]]]:
    """Each reuse stream of ``--streams``: its factory (seed -> stream) and its levers."""
    tasks, dim, train, hidden = 25, 128, 256, [128]
    pm_train, pm_hidden = 500, [256]
    if args.small:
        tasks, dim, train, hidden, pm_train, pm_hidden = 8, 32, 64, [32], 100, [32]
    recur = 3 if args.small else 5

    def recall(**kwargs: Any) -> Callable[[int], TaskStream]:
        return lambda seed: AssociativeRecall(tasks, 8, 10, dim, train, 128, 32, seed=seed, **kwargs)

    def pmnist(seed: int) -> TaskStream:
        return PermutedMNIST(tasks, train_size=pm_train, query_size=200, chunk_size=100, seed=seed, recur_every=recur)

    streams = {}
    if "AssociativeRecall" in args.streams:
        label = next(iter(MATCHED))  # StableKeyMemory, one state at about the levers' bytes (5,640 B at keys in R^128)
        levers = [*lever_specs(hidden), (label, stable_key_memory(label, hidden, 1e-3, MATCHED[label]))]
        streams["revise f 0.25"] = (recall(revise=True, change_fraction=0.25), levers)
        streams["revise f 1.0"] = (recall(revise=True, change_fraction=1.0), levers)
        streams["recur k 5"] = (recall(recur_every=recur), levers)
    if "PermutedMNIST" in args.streams:
        shapes = {**GOALS, **MATCHED}
        levers = lever_specs(pm_hidden) + [(n, stable_key_memory(n, pm_hidden, 3e-4, s)) for n, s in shapes.items()]
        for _, spec in levers:
            spec.lr = 3e-4  # configs/delta_rule_pmnist.yaml
        streams["PermutedMNIST recur k 5"] = (pmnist, levers)
    return streams


def main(argv: list[str] | None = None) -> dict:
    """Every lever on every reuse stream over ``--repeats`` seeds; JSON and a Markdown table under ``--out``."""
    p = parser(__doc__, repeats=5, repeats_help="seeds", out=icl.RESULTS)
    p.add_argument(
        "--streams", nargs="+", default=["AssociativeRecall"], choices=["AssociativeRecall", "PermutedMNIST"]
    )
    bench = icl.start("lifelong_reuse", p, argv)
    args = bench.args
    if args.small:
        args.repeats = 1
    started, rows = time.perf_counter(), []
    for stream_name, (make_stream, levers) in stream_specs(args).items():
        streams = [make_stream(seed) for seed in range(args.repeats)]  # built once: MNIST is resized per stream
        for label, spec in levers:
            runs = [run(spec, stream, seed) for seed, stream in enumerate(streams)]
            row: dict[str, Any] = {"stream": stream_name, "lever": label, "bytes": runs[0]["bytes"]}
            for m in METRICS:
                values = [r[m] for r in runs]
                finite = [v for v in values if v == v]  # NaN where the stream has no such score
                row[m] = statistics.fmean(finite) if finite else float("nan")
                row[f"{m}_std"] = statistics.pstdev(finite) if len(finite) > 1 else 0.0
            rows.append(row)
            print(f"{stream_name:<24}{label:<44}" + " ".join(f"{m} {row[m]:.3f}" for m in METRICS), flush=True)
    cells = [[r["stream"], r["lever"], f"{r['bytes']:,}", *(_cell(r[m], r[f"{m}_std"]) for m in METRICS)] for r in rows]
    table = "\n".join(icl.markdown_table(COLUMNS, "llrrrrrrrr", cells))
    result = {"rows": rows, "seconds": time.perf_counter() - started, "repeats": args.repeats}
    stem = "reuse" if args.streams == ["AssociativeRecall"] else "reuse_" + "_".join(args.streams)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (args.out / f"{stem}.md").write_text(table + "\n")
    return bench.finish(result, COLUMNS, cells, [f"total {result['seconds'] / 60:.1f} min; results in {args.out}"])


if __name__ == "__main__":
    main()
