"""Lifelong in-context learning, a fair fight: live recall against context-memory bytes (issue 24).

McDermott, Heath Jr., Parhi (2026) claim a bounded *parametric* state (a fast-weight matrix written by online
regression) is what lifelong in-context learning needs, since a buffer of raw examples must evict (property 4).
The scorecard (``lifelong_icl.py``) compared them at one budget, 5 KB, where a buffer holds 9 examples. This script
sweeps the budget from ~1 KB to ~1 MB (×4 steps) and asks where the curves cross:

- **buffer learners**, each with FIFO and reservoir buffers of ``budget // row_bytes`` examples (at least 2):
  kNN (k = 1) and QOA (its scorer trained online on the buffer, the whole buffer as support set);
- **fast-weight rules** with the state sized to the budget: the delta rule and the gated delta rule
  (d_k = budget / (4 · d_v)), TTT-Linear (d_k² + d_k floats); the slow encoder is not counted (QOA's scorer is
  not either): the budget is the *context* memory, counted by ``cl_lightning.memory.accounting`` (these rules hold
  no fixed projection). ``--row-precision data`` charges a buffer row at the data's own precision (Permuted MNIST:
  49 8-bit pixels and a 1-byte label, 50 B, against 212 B as stored).

Live recall at lag L is the accuracy on task t − L's held-out queries read from the learner's memory only, over
the last ``eval_last`` tasks, on AssociativeRecall (every task a new map of 8 associations; chance 0.10) and a small
Permuted MNIST (chance 0.10); mean ± std over seeds (stream and learner seeded alike). The crossover budget is the
smallest budget at which the best buffer learner's recall at a lag reaches the best fast-weight rule's.

    OMP_NUM_THREADS=1 python -m benchmarks.lifelong_budget [--small] [--repeats 5] [--threads 1] [--out DIR]

writes ``budget.json``, ``budget.md``, ``budget_<stream>.{json,md,png}`` and the harness's ``lifelong_budget.json``
/ ``.md`` (every stream's table, the crossovers, the environment) under ``--out`` (default docs/results/lifelong_icl).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import lifelong_icl as icl
from benchmarks.harness import parser
from cl_lightning.data import AssociativeRecall, PermutedMNIST
from cl_lightning.data.stream import TaskStream
from cl_lightning.learners import KNN, QueryOnlyAttention
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.memory.accounting import Precision
from cl_lightning.nn.fast_weights import DeltaRule, GatedDeltaRule, TTTLinear

LAGS = icl.LAGS
BUDGETS = [1024 * 4**i for i in range(6)]  # 1 KB ... 1 MB
BUFFER = ("knn_fifo", "knn_reservoir", "qoa_fifo", "qoa_reservoir")
QOA_QUERIES = 16  # queries per QOA step: with 1, its scorer takes 200 one-query steps per stream and stays at chance
RULES = {"delta_rule": DeltaRule, "gated_delta_rule": GatedDeltaRule, "ttt_linear": TTTLinear}
PARAMETRIC = tuple(RULES)
COLUMNS = ["stream", "learner", "budget B", "bytes held", "forward", "lag 1", "lag 5", "lag 20"]


def buffer_rows(stream: TaskStream, budget: int, precision: Precision = "stored") -> int:
    """Examples a replay buffer holds in ``budget`` bytes (at least 2: QOA needs a support and a query), rows
    charged as stored or at the data's precision (``cl_lightning.memory.accounting``)."""
    return max(2, budget // icl.row_bytes(stream, precision))


def key_dim_for(rule: str, budget: int, num_outputs: int) -> int:
    """d_k whose state fits ``budget`` bytes: d_k · d_v floats, or d_k² + d_k for TTT-Linear."""
    floats = budget // 4
    if rule == "ttt_linear":
        return max(2, int((math.sqrt(1 + 4 * floats) - 1) / 2))
    return max(2, floats // num_outputs)


def buffer_spec(name: str, budget: int, hidden: list[int], precision: Precision = "stored") -> icl.Spec:
    """kNN (k = 1) or QOA with a FIFO or reservoir buffer of the budget's rows (the whole buffer as support)."""
    kind, mode = name.split("_")

    def make(stream: TaskStream) -> ContinualLearner:
        n = buffer_rows(stream, budget, precision)
        queries = max(1, min(QOA_QUERIES, n // 2))  # a step's queries, drawn from the buffer (the rest: support)
        if kind == "knn":
            return KNN(input_shape=stream.input_shape, num_outputs=stream.num_outputs, memory_size=n, buffer_mode=mode,
                       support_size=n, k=1, online_queries=0)  # fmt: skip
        return QueryOnlyAttention(
            input_shape=stream.input_shape,
            num_outputs=stream.num_outputs,
            memory_size=n,
            buffer_mode=mode,
            support_size=n - queries,
            queries_per_step=queries,
            sampler="uniform",
            start_when_full=False,
            hidden=hidden[0],
            num_hidden_layers=2,
        )

    return icl.Spec(name, make, lr=1e-3)


def parametric_spec(rule: str, budget: int, hidden: list[int], num_outputs: int, lr: float) -> icl.Spec:
    """A fast-weight rule whose state is sized to ``budget``."""
    spec = icl.parametric(rule, hidden, rule=RULES[rule](), key_dim=key_dim_for(rule, budget, num_outputs))
    spec.lr = lr
    return spec


def run_cell(spec: icl.Spec, make_stream: Callable[[int], TaskStream], seeds: int, eval_last: int, queries: int):
    """Mean and std of live recall at each lag over ``seeds`` seeds, and the forward (lag 0) mean."""
    runs = [icl.run_stream(spec, make_stream(seed), eval_last, queries, seed=seed) for seed in range(seeds)]
    forward = statistics.fmean(r["forward"] for r in runs)
    return {"forward": forward, **icl.recall_stats(runs, LAGS), "state_bytes": runs[0]["state_bytes"]}


def crossover(cells: dict[str, dict[int, dict[str, Any]]], lag: int) -> int | None:
    """The smallest budget from which on the best buffer learner's mean recall at ``lag`` is at least the best
    fast-weight rule's at every budget both were run at (None if the rules stay ahead at the largest)."""
    found = None
    for budget in sorted({b for by_budget in cells.values() for b in by_budget}):
        buffers = [cells[n][budget][f"mean{lag}"] for n in cells if n in BUFFER and budget in cells[n]]
        rules = [cells[n][budget][f"mean{lag}"] for n in cells if n not in BUFFER and budget in cells[n]]
        if buffers and rules:
            found = (found or budget) if max(buffers) >= max(rules) else None
    return found


def sweep(stream_name: str, make_stream: Callable[[int], TaskStream], args: argparse.Namespace, cfg: dict) -> dict:
    """Every learner at every budget on one stream."""
    probe = make_stream(0)
    cells: dict[str, dict[int, dict[str, Any]]] = {}
    for name in args.learners:
        cells[name] = {}
        for budget in args.budgets:
            if name.startswith("qoa") and args.qoa_max_bytes and budget > args.qoa_max_bytes:
                continue  # its pair scorer runs queries x supports MLP passes: minutes per seed at 1,000s of rows
            if name in PARAMETRIC and args.rule_max_bytes and budget > args.rule_max_bytes:
                continue  # d_k = budget / 40: a 128 x 26,214 key projection trained by Adam at 1 MB
            if name in PARAMETRIC:
                spec = parametric_spec(name, budget, cfg["hidden"], probe.num_outputs, cfg["lr"])
            else:
                spec = buffer_spec(name, budget, cfg["hidden"], args.row_precision)
            t0 = time.perf_counter()
            cell = run_cell(spec, make_stream, args.repeats, cfg["eval_last"], cfg["queries"])
            rows = buffer_rows(probe, budget, args.row_precision)
            cell["bytes"] = cell.pop("state_bytes") or rows * icl.row_bytes(probe, args.row_precision)
            cells[name][budget] = cell
            print(
                f"{stream_name:<18}{name:<17}{budget:>9,} B ({cell['bytes']:>9,}) "
                + " ".join(f"L{lag} {cell[f'mean{lag}']:.3f}±{cell[f'std{lag}']:.3f}" for lag in LAGS)
                + f"  ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    return {"cells": cells, "crossover": {lag: crossover(cells, lag) for lag in LAGS}}


LOG_LINE = re.compile(r"^(\S+)\s+(\S+)\s+([\d,]+) B \(\s*([\d,]+)\) L1 (\S+)±(\S+) L5 (\S+)±(\S+) L20 (\S+)±(\S+)")


def from_logs(stream_name: str, logs: list[Path]) -> dict:
    """A stream's cells rebuilt from the progress lines of runs that together cover the sweep (later lines win;
    the forward mean is not in them: NaN)."""
    cells: dict[str, dict[int, dict[str, Any]]] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            m = LOG_LINE.match(line)
            if m and m.group(1) == stream_name:
                v = [float(x) for x in m.groups()[4:]]
                cell: dict[str, Any] = {"bytes": int(m.group(4).replace(",", "")), "forward": float("nan")}
                for i, lag in enumerate(LAGS):
                    cell[f"mean{lag}"], cell[f"std{lag}"] = v[2 * i], v[2 * i + 1]
                cells.setdefault(m.group(2), {})[int(m.group(3).replace(",", ""))] = cell
    cells = {n: cells[n] for n in (*BUFFER, *PARAMETRIC) if n in cells}
    return {"cells": cells, "crossover": {lag: crossover(cells, lag) for lag in LAGS}}


def figure(stream_name: str, result: dict, path: Path, chance: float) -> None:
    """One panel per lag: live recall against context bytes, a line per learner (mean ± std band)."""
    fig, axes = icl._plt().subplots(1, len(LAGS), figsize=(5 * len(LAGS), 4), sharey=True)
    for ax, lag in zip(axes, LAGS, strict=True):
        if all(math.isnan(c[f"mean{lag}"]) for cells in result["cells"].values() for c in cells.values()):
            ax.set_title(f"lag {lag}: stream too short")
            continue
        for name, by_budget in result["cells"].items():
            cells = [by_budget[b] for b in sorted(by_budget)]
            x = [c["bytes"] for c in cells]
            m = [c[f"mean{lag}"] for c in cells]
            s = [c[f"std{lag}"] for c in cells]
            style = "--" if name in BUFFER else "-"
            line = ax.plot(x, m, style + "o", ms=3, label=name)[0]
            ax.fill_between(x, [a - b for a, b in zip(m, s, strict=True)], [a + b for a, b in zip(m, s, strict=True)],
                            color=line.get_color(), alpha=0.12)  # fmt: skip
        ax.axhline(chance, color="k", ls=":", lw=1)
        cross = result["crossover"][lag]
        ax.set_title(f"lag {lag} (crossover: {'none' if cross is None else f'{cross:,} B'})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context memory bytes")
    axes[0].set_ylabel("live recall (mean ± std over seeds)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{stream_name}: buffers (dashed) vs fast-weight states (solid)")
    icl.save_figure(fig, path)


def table_rows(stream_name: str, result: dict) -> list[list[str]]:
    """The cells of the COLUMNS: learner, budget, bytes held, forward, recall at each lag (mean ± std)."""
    rows = []
    for name, by_budget in result["cells"].items():
        for budget, c in sorted(by_budget.items()):
            lags = (f"{c[f'mean{lag}']:.3f} ± {c[f'std{lag}']:.3f}" for lag in LAGS)
            rows.append([stream_name, name, f"{budget:,}", f"{c['bytes']:,}", icl._fmt(c["forward"]), *lags])
    return rows


def crossover_line(stream_name: str, result: dict) -> str:
    """``Crossover (<stream>): lag 1: ..., lag 5: ..., lag 20: ...``."""
    cross = ", ".join(f"lag {lag}: {'none' if b is None else f'{b:,} B'}" for lag, b in result["crossover"].items())
    return f"Crossover ({stream_name}): {cross}"


def table(stream_name: str, result: dict) -> list[str]:
    """Markdown lines: the stream's table, then its crossovers."""
    return [*icl.markdown_table(COLUMNS, "llrrrrrr", table_rows(stream_name, result)), "",
            crossover_line(stream_name, result), ""]  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    """Sweep the budgets on both streams; write JSON, a Markdown table and one figure per stream."""
    p = parser(__doc__, repeats=5, repeats_help="seeds per cell", out=icl.RESULTS)
    p.add_argument("--budgets", type=int, nargs="+", default=BUDGETS)
    p.add_argument("--pmnist-train", type=int, default=500, help="Permuted-MNIST images per task")
    p.add_argument("--streams", nargs="+", default=["AssociativeRecall", "PermutedMNIST"])
    p.add_argument("--qoa-max-bytes", type=int, default=None, help="skip QOA above this budget")
    p.add_argument("--rule-max-bytes", type=int, default=None, help="skip the fast-weight rules above this")
    p.add_argument("--learners", nargs="+", default=[*BUFFER, *PARAMETRIC], choices=[*BUFFER, *PARAMETRIC])
    p.add_argument("--from-logs", type=Path, nargs="+", help="rebuild the tables from progress logs")
    p.add_argument("--row-precision", choices=["stored", "data"], default="stored",
                   help="charge buffer rows as stored (float32 x, int64 y and task id) or at the data's precision "
                   "(8-bit pixels, 1-byte label, no task id); 'data' writes budget_<stream>_data.*")  # fmt: skip
    bench = icl.start("lifelong_budget", p, argv)
    args = bench.args
    tasks, items, dim, train, pm_tasks = 25, 8, 128, 256, 22
    if args.small:
        tasks, items, dim, train, pm_tasks, args.repeats = 7, 4, 32, 64, 7, 1
        args.budgets, args.pmnist_train = [1024, 8192], 100
    started = time.perf_counter()

    def recall(seed: int) -> TaskStream:
        return AssociativeRecall(num_tasks=tasks, num_items=items, input_dim=dim, train_size=train, query_size=128,
                                 chunk_size=32, seed=seed)  # fmt: skip

    def pmnist(seed: int) -> TaskStream:
        return PermutedMNIST(num_tasks=pm_tasks, train_size=args.pmnist_train, query_size=200, chunk_size=100,
                             seed=seed)  # fmt: skip

    configs = {
        "AssociativeRecall": (recall, {"hidden": [128], "lr": 1e-3, "eval_last": 5, "queries": 128}),
        "PermutedMNIST": (pmnist, {"hidden": [256], "lr": 3e-4, "eval_last": 2, "queries": 200}),
    }
    result: dict[str, Any] = {}
    lines, rows, crossovers = [], [], []
    suffix = "_data" if args.row_precision == "data" else ""
    for name in args.streams:
        make, cfg = configs[name]
        result[name] = from_logs(name, args.from_logs) if args.from_logs else sweep(name, make, args, cfg)
        figure(name, result[name], args.out / f"budget_{name}{suffix}.png", 0.1)
        lines += table(name, result[name])
        rows += table_rows(name, result[name])
        crossovers.append(crossover_line(name, result[name]))
        (args.out / f"budget_{name}{suffix}.json").write_text(json.dumps(result[name], indent=1, default=str))
        (args.out / f"budget_{name}{suffix}.md").write_text("\n".join(table(name, result[name])))
    result["seconds"] = time.perf_counter() - started
    saved = {"args": {k: str(v) for k, v in vars(args).items()}, **result}
    (args.out / f"budget{suffix}.json").write_text(json.dumps(saved, indent=1, default=str))
    (args.out / f"budget{suffix}.md").write_text("\n".join(lines))
    notes = [*crossovers, f"total {result['seconds'] / 60:.1f} min; results in {args.out}"]
    return bench.finish(result, COLUMNS, rows, notes)


if __name__ == "__main__":
    main()
