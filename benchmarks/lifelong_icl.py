"""Lifelong in-context learning scorecard: the four properties, measured for every learner (issue 14).

McDermott, Heath Jr., Parhi (2026) name four properties lifelong in-context learning needs — (1) an expressive,
eviction-free context memory, (2) per-token cost independent of the context length, (3) parallelisable updates,
(4) bounded memory without eviction — and three open questions (objective / regularisation, long-range signal, how
keys and values are made). The recall and the bytes — properties (1) and (4) — and the open questions run through
the package: ``configs/suites/lifelong_scorecard_{recall,pmnist}.yaml`` (every learner at 5,120 bytes),
``lifelong_levers_recall.yaml`` (the open questions as levers, 3 seeds), ``lifelong_capacity_recall.yaml`` and the
encoder study ``lifelong_encoder_pmnist.yaml``, with ``sweep`` and ``report``. What stays here is what a clock measures:

1. **ms per token** early vs late in the stream (property 2), every learner at the matched bytes, on the
   AssociativeRecall stream (every task a new key -> value map) and on Permuted MNIST; the same runs print their
   live recall at lags 1, 5 and 20 (read from the learner's memory only) and the keys' coherence as a check against
   the suites';
2. **chunked vs recurrent tokens/s** of every op and its scaling with the chunk size (property 3).

One process, one thread (``--threads 1``, the default): run it with ``OMP_NUM_THREADS=1`` on a shared machine.

    python -m benchmarks.lifelong_icl [--quick | --small] [--skip PART ...] [--out benchmarks/results/lifelong_icl]

writes ``scorecard.json``, ``tables.md`` and one PNG per property under ``--out``, beside the harness's
``lifelong_icl.json`` / ``.md`` (seconds per part, the tables, the environment).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import Bench, clock, parser
from cl_lightning.data import AssociativeRecall, PermutedMNIST
from cl_lightning.data.stream import TaskStream
from cl_lightning.learners import KNN, FullAttention, ParametricAttention, QueryOnlyAttention
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.memory.accounting import Precision, memory_bytes, stream_row_bytes
from cl_lightning.metrics.key_coherence import cross_task_coherence
from cl_lightning.nn import fast_weights as fw

LAGS = (1, 5, 20)
STATE_FLOATS = 128 * 10  # the matched budget: a 128 x 10 float32 state, 5,120 bytes
RESULTS = Path("docs/results/lifelong_icl")  # where the scorecard writes by default


@dataclass
class Spec:
    """A learner to run: a name, a factory taking the stream, and the Adam learning rate of its slow weights."""

    name: str
    make: Callable[[TaskStream], ContinualLearner]
    lr: float = 1e-3
    tags: dict[str, Any] = field(default_factory=dict)


def row_bytes(stream: TaskStream, precision: Precision = "stored") -> int:
    """Bytes of one example in a replay buffer: as stored (x float32, y and task id int64) or at the data's own
    precision (``cl_lightning.memory.accounting``: 8-bit pixels, a 1-byte label, no task id)."""
    return stream_row_bytes(stream, precision)


def matched_buffer(stream: TaskStream) -> int:
    """Examples a replay buffer may hold in the parametric state's bytes (at least 2)."""
    return max(2, STATE_FLOATS * 4 // row_bytes(stream))


def parametric(name: str, hidden: list[int], **kwargs: Any) -> Spec:
    """A ParametricAttention spec with the stream's shapes linked in."""

    def make(stream: TaskStream) -> ContinualLearner:
        return ParametricAttention(
            input_shape=stream.input_shape, num_outputs=stream.num_outputs, hidden_sizes=hidden, **kwargs
        )

    return Spec(name, make, tags=kwargs)


def nonparametric_specs(hidden: list[int]) -> list[Spec]:
    """QOA, full attention and kNN with FIFO buffers of the matched bytes, and an unbounded kNN as the reference."""

    def attending(cls: type[ContinualLearner], **kwargs: Any) -> Callable[[TaskStream], ContinualLearner]:
        """A learner attending over a FIFO buffer of the matched bytes, each step's query one stored example."""

        def make(stream: TaskStream) -> ContinualLearner:
            n = matched_buffer(stream)
            shapes = {"input_shape": stream.input_shape, "num_outputs": stream.num_outputs}
            return cls(**shapes, memory_size=n, support_size=n - 1, **kwargs)

        return make

    qoa = attending(QueryOnlyAttention, sampler="uniform", start_when_full=True, hidden=hidden[0], num_hidden_layers=2)
    full = attending(FullAttention, admit_last=None, num_layers=2)

    def knn_of(stream: TaskStream, n: int) -> ContinualLearner:  # 1-NN over a FIFO buffer of n examples
        return KNN(
            input_shape=stream.input_shape,
            num_outputs=stream.num_outputs,
            memory_size=n,
            support_size=n,
            k=1,
            online_queries=0,
        )

    def knn(stream: TaskStream) -> ContinualLearner:
        return knn_of(stream, matched_buffer(stream))

    def knn_all(stream: TaskStream) -> ContinualLearner:
        return knn_of(stream, stream.num_tasks * stream.train_size)

    return [
        Spec("qoa", qoa, lr=1e-3),
        Spec("full_attention", full, lr=5e-4),
        Spec("knn", knn),
        Spec("knn_unbounded", knn_all, tags={"unbounded": True}),
    ]


def parametric_specs(hidden: list[int]) -> list[Spec]:
    """Every rule at about STATE_FLOATS floats of state (d_k chosen per rule; the bytes are printed)."""
    return [
        parametric("linear_attn", hidden, rule=fw.LinearAttention(), key_dim=128),
        parametric("decay", hidden, rule=fw.DecayLinearAttention(), key_dim=128),
        parametric("delta_rule", hidden, rule=fw.DeltaRule(), key_dim=128),
        parametric("gated_delta_rule", hidden, rule=fw.GatedDeltaRule(), key_dim=128),
        parametric("longhorn", hidden, rule=fw.Longhorn(), key_dim=128),
        parametric("omega_c4", hidden, key_dim=128, rule=fw.OmegaRule(window=4)),
        # W and momentum: 2 x 64 x 10; exact per-token gradients (mini-batches of 16 diverged to NaN at mu 0.9)
        parametric("titans", hidden, key_dim=64, rule=fw.Titans(mini_batch_size=1)),
        parametric("ttt_linear", hidden, rule=fw.TTTLinear(), key_dim=36),  # 36 x 36 + 36 = 1,332 floats
        parametric("ttt_mlp", hidden, key_dim=48, rule=fw.TTTMLP(hidden=20)),  # 48*20+20+20*10+10 = 1,190
    ]


class Runner:
    """Runs one learner over a stream as the Trainer would (one optimiser step per chunk), without Lightning's loop.

    ``self.log`` has no trainer to log to here; the warning is silenced. A learner with manual optimisation (QOA)
    gets its optimiser and ``manual_backward`` wired to plain autograd.
    """

    def __init__(self, learner: ContinualLearner, lr: float) -> None:
        self.learner = learner
        params = [p for p in learner.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(params, lr=lr) if params else None
        if not learner.automatic_optimization:
            learner.optimizers = lambda: self.optimizer  # type: ignore[method-assign]
            learner.manual_backward = lambda loss, *a, **k: loss.backward()  # type: ignore[method-assign]

    def step(self, batch: Any, index: int) -> None:
        loss = self.learner.training_step(batch, index)
        if loss is not None and self.learner.automatic_optimization and self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()


def live_accuracy(learner: ContinualLearner, stream: TaskStream, task: int, queries: int) -> float:
    """Accuracy on task ``task``'s held-out queries read from the learner's memory only (no context given)."""
    data = stream.task(task)
    with torch.no_grad():
        pred = learner(data.query_x[:queries])
    return (pred.argmax(-1) == data.query_y[:queries]).float().mean().item()


def stored_examples(learner: ContinualLearner) -> int:
    """Examples held in a replay buffer (0 for a fast state)."""
    buffer = getattr(learner, "buffer", None)
    return 0 if buffer is None else len(buffer)


def run_stream(spec: Spec, stream: TaskStream, eval_last: int, queries: int, seed: int = 0) -> dict[str, Any]:
    """Train one learner over the stream; live recall at each lag over the last ``eval_last`` tasks, costs."""
    torch.manual_seed(seed)
    learner = spec.make(stream)
    runner = Runner(learner, spec.lr)
    recall: dict[int, list[float]] = {lag: [] for lag in LAGS}
    times, seen, bytes_trace = [], 0, []
    for task in range(stream.num_tasks):
        for i in range(stream.num_chunks):
            batch = stream.chunk(task, i)
            start = time.perf_counter()
            runner.step(batch, i)
            times.append((time.perf_counter() - start) / batch.x.shape[0])
            seen += batch.x.shape[0]
        row = row_bytes(stream) if hasattr(learner, "buffer") else None
        bytes_trace.append((seen, memory_bytes(learner, row).budget))
        if task >= stream.num_tasks - eval_last:
            for lag in LAGS:
                if task - lag >= 0:
                    recall[lag].append(live_accuracy(learner, stream, task - lag, queries))
    window = max(1, len(times) // 10)
    evicted = seen - stored_examples(learner) if hasattr(learner, "buffer") else 0
    return {
        "recall": {lag: statistics.fmean(v) if v else float("nan") for lag, v in recall.items()},
        "forward": live_accuracy(learner, stream, stream.num_tasks - 1, queries),
        "ms_per_token_early": 1e3 * statistics.median(times[:window]),
        "ms_per_token_late": 1e3 * statistics.median(times[-window:]),
        "bytes_trace": bytes_trace,
        "evicted": evicted,
        # context state and fixed projections (memory.accounting): what a query reads, trained weights excluded
        "state_bytes": memory_bytes(learner).budget if isinstance(learner, ParametricAttention) else None,
        "key_coherence": key_coherence(learner, stream, queries) if isinstance(learner, ParametricAttention) else None,
    }


def key_coherence(learner: ParametricAttention, stream: TaskStream, queries: int) -> float:
    """Mean |cos| between the read keys (first head) of the last 21 tasks' first queries, pairs of different tasks
    (the package's ``cross_task_coherence``, which ``KeyCoherenceMonitor`` logs)."""
    tasks = range(max(0, stream.num_tasks - 21), stream.num_tasks)
    with torch.no_grad():
        keys = [learner.read_keys(stream.task(t).query_x[: min(queries, 32)])[0] for t in tasks]
    task_ids = torch.cat([torch.full((k.shape[0],), i) for i, k in enumerate(keys)])
    return cross_task_coherence(torch.cat(keys), task_ids).item()


# --- property 3: chunked vs recurrent throughput of every op ---------------------------------------------------------


def op_cases(tokens: int) -> dict[str, tuple[Callable[..., Any], Callable[..., Any], dict[str, Any], str]]:
    """Each op's (recurrent reference, chunked form, inputs, name of its chunk argument) at d_k = 128, d_v = 10."""
    from cl_lightning.ops import (
        decay,
        delta_rule,
        gated_delta_rule,
        linear_attn,
        longhorn,
        omega,
        titans,
        ttt_linear,
        ttt_mlp,
    )

    gen = torch.Generator().manual_seed(0)
    key, val = 128, 10

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(1, 1, tokens, *shape, generator=gen)

    keys = torch.nn.functional.normalize(rnd(key), dim=-1)
    q, v, beta = rnd(key), rnd(val), torch.rand(1, 1, tokens, generator=gen)
    g = -0.01 * torch.rand(1, 1, tokens, generator=gen)
    base = {"q": q, "k": keys, "v": v}
    sq = torch.nn.functional.normalize(rnd(64), dim=-1)
    mlp_state = (
        torch.randn(1, 1, 48, 20, generator=gen),
        torch.zeros(1, 1, 20),
        torch.zeros(1, 1, 20, val),
        torch.zeros(1, 1, val),
    )
    k48 = torch.nn.functional.normalize(rnd(48), dim=-1)
    return {
        "linear_attn": (linear_attn.naive_recurrent_linear_attn, linear_attn.chunk_linear_attn, base, "chunk_size"),
        "decay": (
            decay.naive_recurrent_decay_linear_attn,
            decay.chunk_decay_linear_attn,
            {**base, "g": g},
            "chunk_size",
        ),
        "delta_rule": (
            delta_rule.naive_recurrent_delta_rule,
            delta_rule.chunk_delta_rule,
            {**base, "beta": beta},
            "chunk_size",
        ),
        "gated_delta_rule": (
            gated_delta_rule.naive_recurrent_gated_delta_rule,
            gated_delta_rule.chunk_gated_delta_rule,
            {**base, "beta": beta, "g": g},
            "chunk_size",
        ),
        "longhorn": (longhorn.naive_recurrent_longhorn, longhorn.chunk_longhorn, {**base, "beta": beta}, "chunk_size"),
        "omega_c4": (
            omega.naive_recurrent_omega_rule,
            omega.chunk_omega_rule,
            {**base, "beta": beta / 4, "window": 4},
            "chunk_size",
        ),
        "titans": (
            titans.naive_recurrent_titans_linear,
            titans.chunk_titans_linear,
            {**base, "beta": beta, "log_momentum": g, "log_retain": g},
            "mini_batch_size",
        ),
        "ttt_linear": (
            ttt_linear.naive_recurrent_ttt_linear,
            ttt_linear.chunk_ttt_linear,
            {"q": sq, "k": sq, "v": sq, "beta": beta / 64},
            "mini_batch_size",
        ),
        "ttt_mlp": (
            ttt_mlp.naive_recurrent_ttt_mlp,
            ttt_mlp.chunk_ttt_mlp,
            {"q": k48, "k": k48, "v": v, "beta": beta / 48, "initial_state": mlp_state},
            "mini_batch_size",
        ),
    }


def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def op_throughput(tokens: int, chunk_sizes: list[int], repeats: int) -> dict[str, Any]:
    """Tokens/s of every op's recurrent reference and of its chunked form at each chunk size (forward, no grad).

    For titans / ttt_* the chunk is the gradient mini-batch, so the reference runs with the same mini-batch (the
    two compute the same numbers; a different mini-batch is a different rule).
    """
    out: dict[str, Any] = {}
    with torch.no_grad():
        for name, (naive, chunk, inputs, arg) in op_cases(tokens).items():
            row: dict[str, Any] = {"chunked": {}}
            mini = arg == "mini_batch_size"
            for size in chunk_sizes:
                row["chunked"][size] = tokens / _best_time(partial(chunk, **inputs, **{arg: size}), repeats)
            ref_kwargs = {arg: 16} if mini else {}
            row["recurrent"] = tokens / _best_time(partial(naive, **inputs, **ref_kwargs), 1)
            row["chunked_at_16"] = tokens / _best_time(partial(chunk, **inputs, **{arg: 16}), repeats)
            out[name] = row
            rates = f"recurrent {row['recurrent']:>10,.0f} tok/s  chunked(16) {row['chunked_at_16']:>10,.0f}"
            print(f"op {name:<18} {rates}", flush=True)
    return out


# --- figures and tables --------------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` (110 dpi) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)


def _stream_panels(card: dict[str, dict[str, Any]]) -> tuple[Any, list[Any]]:
    """A figure with one panel per stream of ``card``, side by side, and its axes."""
    fig, axes = _plt().subplots(1, len(card), figsize=(6.5 * len(card), 4), squeeze=False)
    return fig, list(axes[0])


def figure_recall(card: dict[str, dict[str, Any]], chance: dict[str, float], path: Path) -> None:
    """Property 1: live recall at each lag, one panel per stream, one bar group per learner."""
    fig, axes = _plt().subplots(len(card), 1, figsize=(12, 3.6 * len(card)), squeeze=False)
    for ax, (stream_name, rows) in zip(axes[:, 0], card.items(), strict=True):
        names = list(rows)
        width = 0.8 / len(LAGS)
        for i, lag in enumerate(LAGS):
            ax.bar(
                [j + i * width for j in range(len(names))],
                [rows[n]["recall"][lag] for n in names],
                width,
                label=f"lag {lag}",
            )
        ax.axhline(chance[stream_name], color="k", ls="--", lw=1, label="chance")
        ax.set_xticks([j + width for j in range(len(names))], names, rotation=30, ha="right")
        ax.set_ylabel("live recall (acc.)")
        ax.set_title(f"(1) live recall of task t - lag from the learner's own memory: {stream_name}")
        ax.legend(ncol=4, fontsize=8)
    save_figure(fig, path)


def figure_cost(card: dict[str, dict[str, Any]], path: Path) -> None:
    """Property 2: ms per token early vs late in the stream."""
    fig, axes = _stream_panels(card)
    for ax, (stream_name, rows) in zip(axes, card.items(), strict=True):
        names = list(rows)
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [rows[n]["ms_per_token_early"] for n in names], 0.4, label="first 10% of steps")
        ax.bar([i + 0.2 for i in x], [rows[n]["ms_per_token_late"] for n in names], 0.4, label="last 10%")
        ax.set_yscale("log")
        ax.set_xticks(list(x), names, rotation=40, ha="right", fontsize=8)
        ax.set_ylabel("ms per token (train step)")
        ax.set_title(f"(2) per-token cost, early vs late: {stream_name}")
        ax.legend(fontsize=8)
    save_figure(fig, path)


def figure_parallel(ops: dict[str, Any], path: Path) -> None:
    """Property 3: tokens/s of the chunked form vs chunk size, the recurrent reference as a dotted level."""
    fig, ax = _plt().subplots(figsize=(8, 4.5))
    for name, row in ops.items():
        sizes = sorted(row["chunked"], key=int)
        line = ax.plot([int(s) for s in sizes], [row["chunked"][s] for s in sizes], "o-", label=name)[0]
        ax.axhline(row["recurrent"], color=line.get_color(), ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("chunk size (mini-batch for titans / ttt_*)")
    ax.set_ylabel("tokens / s (forward, 1 thread)")
    ax.set_title("(3) chunked form (lines) vs token-by-token recurrence (dotted)")
    ax.legend(fontsize=7, ncol=3)
    save_figure(fig, path)


def figure_memory(card: dict[str, dict[str, Any]], path: Path) -> None:
    """Property 4: context bytes over the stream."""
    fig, axes = _stream_panels(card)
    for ax, (stream_name, rows) in zip(axes, card.items(), strict=True):
        for name, row in rows.items():
            seen, nbytes = zip(*row["bytes_trace"], strict=True)
            style = "--" if row["evicted"] else "-"
            ax.plot(seen, nbytes, style, label=f"{name} (evicted {row['evicted']:,})")
        ax.set_yscale("log")
        ax.set_xlabel("examples seen")
        ax.set_ylabel("context memory bytes")
        ax.set_title(f"(4) memory over the stream (dashed: evicts): {stream_name}")
        ax.legend(fontsize=6, ncol=2)
    save_figure(fig, path)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown_table(columns: Iterable[str], align: str, rows: Iterable[Iterable[Any]]) -> list[str]:
    """Lines of a Markdown table: the ``columns``' header, the separator (``align``: one ``l`` or ``r`` per column),
    and one line per row of cells."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "".join("---|" if a == "l" else "---:|" for a in align)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def scorecard_table(card: dict[str, dict[str, Any]], ops: dict[str, Any]) -> str:
    """Markdown tables: one row per learner and stream, then one row per op."""
    rows = []
    for stream_name, learners in card.items():
        for name, r in learners.items():
            rec = r["recall"]
            rows.append(
                [
                    stream_name,
                    name,
                    f"{r['bytes_trace'][-1][1]:,}",
                    *(_fmt(rec[lag]) for lag in LAGS),
                    _fmt(r["key_coherence"]),
                    f"{r['ms_per_token_early']:.3f}",
                    f"{r['ms_per_token_late']:.3f}",
                    f"{r['ms_per_token_late'] / max(r['ms_per_token_early'], 1e-12):.2f}",
                    f"{r['evicted']:,}",
                ]
            )
    op_rows = []
    for name, row in ops.items():
        best = max(row["chunked"], key=lambda c: row["chunked"][c])
        op_rows.append(
            [
                name,
                f"{row['recurrent']:,.0f}",
                f"{row['chunked_at_16']:,.0f}",
                f"{row['chunked_at_16'] / row['recurrent']:.1f}",
                best,
                f"{row['chunked'][best]:,.0f}",
            ]
        )
    learners_head = ["stream", "learner", "bytes (late)", "recall lag 1", "lag 5", "lag 20", "key \\|cos\\|",
                     "ms/token early", "late", "late/early", "evicted"]  # fmt: skip
    ops_head = ["op", "recurrent tok/s", "chunked tok/s (C = 16)", "ratio", "best C", "tok/s at best C"]
    return "\n".join(
        [*markdown_table(learners_head, "llrrrrrrrrr", rows), "", *markdown_table(ops_head, "lrrrrr", op_rows)]
    )


def tables_markdown(card: dict, ops: dict) -> str:
    """``tables.md``: the scorecard and op tables (when both were run)."""
    return scorecard_table(card, ops) if card and ops else ""


def recall_text(recall: dict[int, float]) -> str:
    """``L1 0.91 L5 0.21 L20 -``: a run's live recall at each lag, for the progress lines."""
    return " ".join(f"L{lag} {_fmt(v)}" for lag, v in recall.items())


def pmnist_stream(args: argparse.Namespace) -> PermutedMNIST:
    """The scorecard's Permuted-MNIST stream (seed 0, chunks of 100, 200 queries)."""
    return PermutedMNIST(num_tasks=args.tasks, train_size=args.pmnist_train, query_size=200, chunk_size=100, seed=0)


def run_scorecard(args: argparse.Namespace, hidden: list[int], recall_stream: Callable[..., TaskStream]) -> dict:
    """Every learner on both streams (seed 0): recall at each lag, cost per token, bytes and evictions."""
    streams = {
        "AssociativeRecall": (recall_stream(0), hidden, args.recall_queries),
        "PermutedMNIST": (pmnist_stream(args), [256], 200),
    }
    card: dict[str, dict[str, Any]] = {}
    for stream_name, (stream, width, queries) in streams.items():
        card[stream_name] = {}
        for spec in nonparametric_specs(width) + parametric_specs(width):
            if spec.name == "longhorn" and stream_name == "PermutedMNIST":
                continue  # its chunked form runs at ~4 ms/token here (property 3 shows why); recall stream only
            t0 = time.perf_counter()
            r = run_stream(spec, stream, eval_last=5, queries=queries)
            card[stream_name][spec.name] = r
            print(
                f"{stream_name:<18}{spec.name:<18} recall {recall_text(r['recall'])}  forward {_fmt(r['forward'])}  "
                f"bytes {r['bytes_trace'][-1][1]:,}  ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    return card


def run_parts(
    args: argparse.Namespace, hidden: list[int], recall_stream: Callable[..., TaskStream]
) -> tuple[dict[str, Any], dict[str, float]]:
    """Each part not in ``--skip``, in order: its result and its wall seconds."""
    runs: dict[str, Callable[[], Any]] = {
        "scorecard": lambda: run_scorecard(args, hidden, recall_stream),
        "ops": lambda: op_throughput(args.tokens, args.chunk_sizes, args.repeats),
    }
    parts: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for part, run in runs.items():
        if part not in args.skip:
            with clock() as t:
                parts[part] = run()
            seconds[part] = t.wall
    return parts, seconds


def write_figures(card: dict, ops: dict, out: Path) -> None:
    """One PNG per property, each where its part was run."""
    if card:
        figure_recall(card, dict.fromkeys(card, 1 / 10), out / "property1_live_recall.png")
        figure_cost(card, out / "property2_cost_per_token.png")
        figure_memory(card, out / "property4_memory.png")
    if ops:
        figure_parallel(ops, out / "property3_chunked_vs_recurrent.png")


def start(name: str, p: argparse.ArgumentParser, argv: list[str] | None) -> Bench:
    """:meth:`Bench.start` for the lifelong benchmarks: ``--out`` made (they write their own files there as they
    go) and the learners' warnings silenced (run outside a Trainer, ``self.log`` has nowhere to log)."""
    bench = Bench.start(name, p, argv)
    warnings.filterwarnings("ignore", message=".*self.(trainer|log).*")
    bench.args.out.mkdir(parents=True, exist_ok=True)
    return bench


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the scorecard and the op throughput (each unless skipped); write JSON, tables and figures under ``--out``."""
    p = parser(__doc__, repeats=2, repeats_help="best-of rounds of each op timing",
               out=Path("benchmarks/results/lifelong_icl"))  # fmt: skip
    p.add_argument("--tasks", type=int, default=25, help="tasks per stream (>= 21 for lag 20)")
    p.add_argument("--items", type=int, default=8, help="AssociativeRecall associations per task")
    p.add_argument("--input-dim", type=int, default=128, help="AssociativeRecall key width")
    p.add_argument("--pmnist-train", type=int, default=2_000, help="Permuted-MNIST training images per task")
    p.add_argument("--recall-train", type=int, default=256, help="AssociativeRecall training examples per task")
    p.add_argument("--recall-queries", type=int, default=128, help="AssociativeRecall held-out queries per task")
    p.add_argument("--tokens", type=int, default=2_048, help="sequence length of the op throughput test")
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer tasks, one seed, short streams")
    p.add_argument("--skip", nargs="*", default=[], choices=["scorecard", "ops"])
    bench = start("lifelong_icl", p, argv)
    args = bench.args
    if args.quick:
        args.tasks, args.pmnist_train, args.tokens = 21, 500, 256
    if args.small:  # lag 5 reached, lag 20 not
        args.tasks, args.items, args.input_dim, args.pmnist_train = 6, 4, 32, 100
        args.recall_train, args.recall_queries, args.tokens, args.chunk_sizes = 32, 32, 32, [8, 16, 32]
    started = time.perf_counter()

    def recall_stream(seed: int) -> AssociativeRecall:
        return AssociativeRecall(
            num_tasks=args.tasks,
            num_items=args.items,
            input_dim=args.input_dim,
            train_size=args.recall_train,
            query_size=args.recall_queries,
            chunk_size=32,
            seed=seed,
        )

    parts, seconds = run_parts(args, [128], recall_stream)
    card, ops = parts.get("scorecard", {}), parts.get("ops", {})
    result = {"scorecard": card, "ops": ops}
    result["seconds"] = time.perf_counter() - started
    saved = {"args": {k: str(v) for k, v in vars(args).items()}, **result}
    (args.out / "scorecard.json").write_text(json.dumps(saved, indent=1, default=str))
    write_figures(card, ops, args.out)
    tables = tables_markdown(card, ops)
    (args.out / "tables.md").write_text(tables)
    notes = [tables, f"total {result['seconds'] / 60:.1f} min; results in {args.out}"]
    overview = [[part, s] for part, s in seconds.items()]
    return bench.finish({**result, "part_seconds": seconds}, ["part", "seconds"], overview, notes)


if __name__ == "__main__":
    main()
