"""Constant memory, constant cost: parametric attention against attention over a replay buffer (issue 5, P2/P4).

Runs each learner over one long Permuted-MNIST stream (chunks of 400, tasks of ``--task-size`` images, one learner
step per chunk: ``training_step``, backward, Adam step, as the Trainer would) and prints, at several points of the
stream, the seconds per step (median over the ``--window`` steps before the point) and the bytes of context memory
(the replay buffer's stored examples, or the fast state). Then the late / early ratios, and whether the
parametric learners' stay flat. Learners:

- ``qoa``: QueryOnlyAttention as the paper's V1 (FIFO buffer grows to its cap of 50,000, support window 1,000,
  training only once the buffer is full, as the authors' code);
- ``full_attention``: FullAttention as the paper (FIFO buffer of 100, 99 supports), if that learner exists;
- ``qoa_read_all``: the cost of *reading* the whole buffer with QOA's scorer (one query, no cap, no training):
  nonparametric attention over all the context seen, the cost that grows without bound;
- ``delta_rule``, ``gated_delta_rule``: ParametricAttention as ``configs/<rule>_pmnist.yaml`` (lifelong protocol);
  a rule class of ``cl_lightning.nn.fast_weights`` (``OmegaRule``, ``Titans``, ``TTTMLP``, ...) runs
  ParametricAttention with that rule.

    python -m benchmarks.constant_memory [--points 10000 50000 100000 200000] [--learners ...]
    python -m benchmarks.constant_memory --small   # 2 points of a 1,600-image stream, QOA's buffer 1,200 (tests)
"""

from __future__ import annotations

import importlib.util
import statistics
import warnings
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.harness import Bench, clock, parser
from cl_lightning.data import PermutedMNIST
from cl_lightning.learners import ParametricAttention, QueryOnlyAttention
from cl_lightning.learners.base import ContinualLearner
from cl_lightning.memory.replay_buffer import ReplayBuffer
from cl_lightning.nn import fast_weights

CHUNK = 400
PARAMETRIC_RULES = {"delta_rule": fast_weights.DeltaRule, "gated_delta_rule": fast_weights.GatedDeltaRule}


def _buffer_bytes(buffer: ReplayBuffer) -> int:
    """Bytes of the examples stored so far (x, y and task id per row; the preallocated tail is not context)."""
    row = sum(t[0].numel() * t.element_size() for t in (buffer.x, buffer.y, buffer.task_id))
    return len(buffer) * row


def context_bytes(learner: ContinualLearner) -> int:
    """Bytes of the learner's context memory: its fast state, or its replay buffer's stored examples."""
    if isinstance(learner, ParametricAttention):
        return learner.context_memory_bytes()  # every buffer of the fast state (W and momentum for titans, ...)
    return _buffer_bytes(learner.buffer)


def _learners(names: list[str], total: int, qoa_memory: int) -> dict[str, tuple[ContinualLearner, Callable | None]]:
    """Each learner and, for the read-only row, the function timed instead of a training step."""
    out: dict[str, tuple[ContinualLearner, Callable | None]] = {}
    for name in names:
        torch.manual_seed(0)
        if name == "qoa":
            out[name] = (QueryOnlyAttention(memory_size=qoa_memory, support_size=1_000), None)
        elif name == "qoa_read_all":
            qoa = QueryOnlyAttention(memory_size=total, support_size=1, start_when_full=True, online_queries=0)

            def read_all(x: torch.Tensor, qoa: QueryOnlyAttention = qoa) -> None:
                with torch.no_grad():
                    qoa.attend(x[:1], qoa.buffer.x[: len(qoa.buffer)], qoa.buffer.y[: len(qoa.buffer)])

            out[name] = (qoa, read_all)
        elif name == "full_attention":
            from cl_lightning.learners import FullAttention

            out[name] = (FullAttention(), None)
        else:
            rule = PARAMETRIC_RULES.get(name) or getattr(fast_weights, name)  # or a rule class by name
            out[name] = (ParametricAttention(rule=rule(), hidden_sizes=[256, 256], key_dim=128), None)
    return out


def _step(learner: ContinualLearner, optimizer: torch.optim.Optimizer, batch: tuple, index: int) -> None:
    loss = learner.training_step(batch, index)
    if loss is not None and learner.automatic_optimization:  # replay learners step inside training_step
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def run(
    learner: ContinualLearner, reader: Callable | None, stream: PermutedMNIST, points: list[int], window: int
) -> list[tuple[int, float, int]]:
    """Rows ``(examples seen, seconds per step, context bytes)`` at each point (in examples) of the stream."""
    optimizer = learner.configure_optimizers()
    if not learner.automatic_optimization:  # QOA steps its optimiser itself: no Trainer here to hand it over
        learner.optimizers = lambda: optimizer  # type: ignore[method-assign]
        learner.manual_backward = lambda loss, *a, **k: loss.backward()  # type: ignore[method-assign]
    per_task, steps = stream.num_chunks, max(points) // CHUNK
    times, rows = [], []
    for i in range(steps):
        batch = stream.chunk(i // per_task, i % per_task)  # data generation is not timed
        if reader is not None:  # the read-only row: store the chunk (untimed), time one read over everything stored
            learner.buffer.add(batch.x.flatten(1), batch.y, batch.task_id)
        with clock() as t:
            if reader is None:
                _step(learner, optimizer, batch, i)
            elif (i + 1) * CHUNK in points:
                reader(batch.x.flatten(1))
        times.append(t.wall)
        if (i + 1) * CHUNK in points:
            recent = times[-window:] if reader is None else times[-1:]
            rows.append(((i + 1) * CHUNK, statistics.median(recent), context_bytes(learner)))
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the learners; the result holds each learner's rows and its late / early ratios."""
    p = parser(__doc__)
    p.add_argument("--points", type=int, nargs="+", default=[10_000, 50_000, 100_000, 200_000])
    p.add_argument("--window", type=int, default=10, help="steps before each point whose median time is shown")
    p.add_argument("--task-size", type=int, default=10_000, help="training images per Permuted-MNIST task")
    p.add_argument("--learners", nargs="+", default=None)
    bench = Bench.start("constant_memory", p, argv)
    args = bench.args
    if args.small:
        args.points, args.window, args.task_size = [800, 1_600], 2, 800
    warnings.filterwarnings("ignore", message=".*self.trainer.*")  # self.log outside a Trainer: nothing to log to
    points = sorted({p - p % CHUNK for p in args.points if p >= CHUNK})
    has_full = importlib.util.find_spec("cl_lightning.learners.full_attention") is not None
    names = args.learners or [
        "qoa",
        *(["full_attention"] if has_full else []),
        "qoa_read_all",
        "delta_rule",
        "gated_delta_rule",
    ]
    tasks = max(points) // args.task_size + 1
    stream = PermutedMNIST(num_tasks=tasks, train_size=args.task_size, query_size=1, chunk_size=CHUNK)
    rows, learners = [], {}
    for name, (learner, reader) in _learners(names, max(points), 1_200 if args.small else 50_000).items():
        measured = run(learner, reader, stream, points, args.window)
        rows += [[name, seen, seconds * 1e3, nbytes] for seen, seconds, nbytes in measured]
        (_, t0, b0), (_, t1, b1) = measured[0], measured[-1]
        ratios = {"time": t1 / max(t0, 1e-9), "bytes": b1 / max(b0, 1)}
        flat = 0.67 <= ratios["time"] <= 1.5 and ratios["bytes"] == 1.0
        learners[name] = {
            "rows": measured,
            **ratios,
            "flat": flat if isinstance(learner, ParametricAttention) else None,
        }
    notes = [f"late / early ratios ({points[-1]:,} vs {points[0]:,} examples; flat: time within 0.67-1.5x, bytes 1):"]
    notes += [
        f"- {name}: time x{v['time']:.2f}, bytes x{v['bytes']:.2f}"
        + ("" if v["flat"] is None else (", flat" if v["flat"] else ", NOT flat"))
        for name, v in learners.items()
    ]
    columns = ["learner", "examples", "ms/step", "context bytes"]
    return bench.finish({"learners": learners}, columns, rows, ["\n".join(notes)])


if __name__ == "__main__":
    main()
