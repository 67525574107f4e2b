"""What one Permuted-MNIST task costs each learner at the paper's settings, phase by phase, against its own floor.

For each learner (Backprop, CBP, QOA V1, QOA V2, kNN, full attention; ``--learners`` picks) one ``Trainer.fit`` of
its paper config with the suite's arguments (``configs/suites/pmnist_paper_full_cpu.yaml``: 200 scored queries an
episode), every configured monitor and checkpoint on, stopped after a few tasks of the 7,500-task stream (so the
probe tasks, the initial row and the monitors' cadences are the long run's):

- epoch 0: one warm-up task (the paper has five; one fills QOA's 50,000-image buffer just the same), not counted;
- evaluated task 0: every monitor fires (the initial row of the accuracy matrix at fit start, the probe row,
  plasticity, Hessian), timed apart;
- evaluated tasks 1 … ``--tasks``: steady tasks, timed (backward lag 1, so each has both episodes: an episode's
  cost does not depend on the lag);
- one more task counted, not timed: its training steps and evaluation episodes run under
  ``torch.utils.flop_counter.FlopCounterMode``; the learner's **floor** is those flops at this machine's matmul rate
  (:func:`benchmarks.harness.matmul_gflops`, the best of the 2048² products measured before and after each fit).
  The same task logs each counted product's operand layout (:class:`Products`); after the fit each is timed alone
  on operands of that layout (:func:`time_products`): **the products at their shapes**, what any implementation
  that computes these products pays, whatever else it saves.

The cost of a task **at the configured cadence** is the steady task's mean plus what task 0 costs above it for
each monitor, divided by its ``every_n_tasks``, plus the accuracy-matrix rows (10 probe rows and the initial row
over 7,500 tasks). Phases: stream data (task generation, wherever it runs), training steps, evaluation episodes,
each monitor, the checkpoint write, other callbacks, and Lightning's loop (what is left of the task's wall time).

    python -m benchmarks.pmnist_task_cost --out docs/results/pmnist_task_cost           # every learner
    python -m benchmarks.pmnist_task_cost --learners bp qoa_v1 --tasks 3
    python -m benchmarks.pmnist_task_cost --learners bp --set callbacks.checkpoint.init_args.every_n_epochs=10
    python -m benchmarks.pmnist_task_cost --small                                        # the test (tiny sizes)
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections import Counter
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from benchmarks.harness import Bench, clock, matmul_gflops, parser
from benchmarks.paper_size import MONITOR_NAMES, PhaseTimer
from cl_lightning.run.cli import main as cli_main

FUSED = "--model.init_args.step_kernel=fused"  # QOA V1 as the suite runs it (the configs: auto, fused on this CPU)
LEARNERS = {  # name: (label, config, extra CLI arguments); the configs are the suite's paper configs
    "bp": ("Backprop", "configs/bp_pmnist.yaml", []),
    "cbp": ("CBP", "configs/cbp_pmnist.yaml", []),
    "qoa_v1": ("QOA V1", "configs/qoa_pmnist.yaml", [FUSED]),
    "qoa_v2": ("QOA V2", "configs/qoa_v2_pmnist.yaml", [FUSED]),
    "knn": ("kNN (1,000 supports)", "configs/knn_pmnist.yaml", []),
    "full_attention": ("Full attention", "configs/full_attention_pmnist.yaml", []),
}
SUITE = [  # the suite's arguments (pmnist_paper_full_cpu.yaml) but one warm-up task; the stream stays 7,500 long
    "--data.stream.init_args.num_tasks=7501",
    "--data.stream.init_args.warmup_tasks=1",
    "--data.eval_queries=200",
    "--data.backward_lag=1",
]
SMALL = [  # --small: the same code path at a size a test can afford
    "--data.stream.init_args.train_size=1200",
    "--data.stream.init_args.query_size=200",
    "--data.stream.init_args.chunk_size=200",  # divides the warm-up task's 1,400 images too (a task a batch)
    "--data.eval_queries=50",
    "--data.context_size=100",
]
SMALL_MODEL = ["--model.init_args.memory_size=1000", "--model.init_args.support_size=100"]
PAPER_TASKS = 7500


@register_flop_formula([torch.ops.aten._euclidean_dist, torch.ops.aten._cdist_forward])
def _dist_flop(x1_shape: Any, x2_shape: Any, *args: Any, **kwargs: Any) -> int:
    """kNN's distances (``torch.cdist`` dispatches ``_euclidean_dist``): the (Q, D) by (S, D) product."""
    q, d, s = x1_shape[-2], x1_shape[-1], x2_shape[-2]
    return 2 * q * s * d * math.prod(x1_shape[:-2])


@register_flop_formula([torch.ops.aten._scaled_dot_product_flash_attention_for_cpu])
def _sdpa_cpu_flop(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    """SDPA on the CPU (full attention's layers): ``Q Kᵀ`` and ``P V``, counted as torch counts its GPU kernels."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


@register_flop_formula([torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward])
def _sdpa_cpu_backward_flop(
    grad_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *a: Any, **k: Any
) -> int:
    """The CPU SDPA's backward: its four products, as torch counts its GPU kernels' backward."""
    return sdpa_backward_flop_count(grad_shape, query_shape, key_shape, value_shape)


def _layout(value: Any) -> Any:
    """A hashable description of an operator argument: a tensor's shape, strides and dtype; containers element by
    element; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_layout(v) for v in value)
    if isinstance(value, dict):
        return ("kwargs", tuple((k, _layout(v)) for k, v in value.items()))
    return value


def _operand(layout: Any) -> Any:
    """An argument of ``layout`` (:func:`_layout`): a tensor with those strides over fresh storage (floats random,
    booleans true, integers zero)."""
    if isinstance(layout, tuple) and layout[:1] == ("tensor",):
        _, shape, stride, dtype = layout
        size = 1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True)) if all(shape) else 0
        base = torch.ones(size, dtype=dtype) if dtype == torch.bool else torch.zeros(size, dtype=dtype)
        if dtype.is_floating_point:
            base.normal_()
        return base.as_strided(shape, stride)
    if isinstance(layout, tuple) and layout[:1] == ("kwargs",):
        return {k: _operand(v) for k, v in layout[1]}
    if isinstance(layout, tuple):
        return tuple(_operand(v) for v in layout)
    return layout


class Products(TorchDispatchMode):
    """Counts each call of a product (an operator ``FlopCounterMode`` has a formula for) by its operands' layout."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[tuple[Any, Any, Any]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """Run ``func``; count it when it is a product."""
        kwargs = kwargs or {}
        if func.overloadpacket in flop_registry:
            self.calls[(func, _layout(args), _layout(kwargs))] += 1
        return func(*args, **kwargs)


def time_products(calls: Counter[tuple[Any, Any, Any]], repeats: int = 3) -> float:
    """CPU seconds of the logged product calls, each layout timed alone: the best of ``repeats`` runs of up to 50
    calls on the same operands (warm caches), times its count."""
    total = 0.0
    for (func, args, kwargs), count in calls.items():
        operands, named = _operand(args), _operand(kwargs)
        func(*operands, **named)
        n = min(count, 50)
        best = math.inf
        for _ in range(repeats):
            start = time.process_time()
            for _ in range(n):
                func(*operands, **named)
            best = min(best, time.process_time() - start)
        total += best / n * count
    return total


class EpochClock(Callback):
    """Each task's start (wall and CPU seconds; a task runs to the next one's start, its checkpoint included) and the
    sum of its training batches' spans, ``on_train_batch_start`` to ``on_train_batch_end``: the step with its
    backward and optimiser step wherever they run (in ``training_step`` or in Lightning's closure)."""

    def __init__(self) -> None:
        self.starts: dict[int, tuple[float, float]] = {}
        self.train: dict[int, list[float]] = {}
        self._batch = (0.0, 0.0)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: Any) -> None:
        """Read both clocks."""
        self.starts[trainer.current_epoch] = (time.perf_counter(), time.process_time())
        self.train[trainer.current_epoch] = [0.0, 0.0]

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """Start a batch's span."""
        self._batch = (time.perf_counter(), time.process_time())

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Add the batch's span."""
        span = self.train[trainer.current_epoch]
        span[0] += time.perf_counter() - self._batch[0]
        span[1] += time.process_time() - self._batch[1]


class FlopCount(Callback):
    """In one task, counts the flops (``FlopCounterMode``) and the products (:class:`Products`) of its training
    portion (first batch to the evaluation) and of its evaluation (the episodes, with whatever the monitors run then:
    nothing at a steady task)."""

    def __init__(self, epoch: int) -> None:
        self.epoch, self.flops = epoch, {"training": 0, "episodes": 0}
        self.products: dict[str, Counter[tuple[Any, Any, Any]]] = {"training": Counter(), "episodes": Counter()}
        self._modes: tuple[FlopCounterMode, Products] | None = None

    def _start(self) -> None:
        self._modes = (FlopCounterMode(display=False), Products())
        for mode in self._modes:
            mode.__enter__()

    def _stop(self, key: str) -> None:
        if self._modes is not None:
            flops, products = self._modes
            products.__exit__(None, None, None)
            flops.__exit__(None, None, None)
            self.flops[key] += flops.get_total_flops()
            self.products[key] += products.calls
            self._modes = None

    def on_train_epoch_start(self, trainer: Trainer, pl_module: Any) -> None:
        """Count from the counted task's first batch."""
        if trainer.current_epoch == self.epoch:
            self._start()

    def on_validation_start(self, trainer: Trainer, pl_module: Any) -> None:
        """The training portion ends; count the evaluation."""
        if trainer.current_epoch == self.epoch:
            self._stop("training")
            self._start()

    def on_validation_end(self, trainer: Trainer, pl_module: Any) -> None:
        """Stop counting."""
        if trainer.current_epoch == self.epoch:
            self._stop("episodes")


def fit(name: str, args: Any) -> dict[str, Any]:
    """One learner's fit: the warm-up task, task 0, the steady tasks, the counted task; matmul before and after."""
    label, config, extra = LEARNERS[name]
    cli_args = ["--config", config, *SUITE, *extra]
    if args.small:
        cli_args += SMALL + (SMALL_MODEL if name in ("qoa_v1", "qoa_v2", "knn") else [])
    cli_args += [f"--{kv}" for kv in args.set]
    cli_args += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    cli_args += ["--trainer.accelerator=cpu"]
    mm_n = 256 if args.small else 2048
    rates = [matmul_gflops("cpu", n=mm_n)]
    steady = args.tasks
    count_epoch = 2 + steady  # warm-up (0), task 0 (1), steady (2 .. 1 + steady), counted
    with tempfile.TemporaryDirectory() as root:
        cli = cli_main(
            [*cli_args, f"--trainer.logger.init_args.save_dir={root}", f"--trainer.default_root_dir={root}"],
            run=False,
        )
        trainer, model, dm = cli.trainer, cli.model, cli.datamodule
        counter, epochs = FlopCount(count_epoch), EpochClock()
        timer = PhaseTimer(count_epoch + 1, torch.device("cpu"))
        trainer.callbacks[:0] = [timer, epochs, counter]
        timer.install(trainer, model, dm.stream, scorer_flops=False)  # FlopCount counts every learner's flops
        dm.prepare_data()
        with clock() as t:
            trainer.fit(model, dm)
        every = {type(c).__name__: getattr(c, "every_n_tasks", 1) for c in trainer.callbacks}
        ckpt_every = next(
            (getattr(c, "_every_n_epochs", 1) or 1 for c in trainer.callbacks if type(c).__name__ == "ModelCheckpoint"),
            0,
        )
        probes = len(dm.probe_tasks)
    rates.append(matmul_gflops("cpu", n=mm_n))
    products = {key: time_products(calls) for key, calls in counter.products.items()}
    tasks = {e - 1: dict(v) for e, v in timer.tasks.items() if 1 <= e < count_epoch}
    for e in range(1, count_epoch):  # the task's span: its start to the next task's start
        (w0, c0), (w1, c1) = epochs.starts[e], epochs.starts[e + 1]
        tasks[e - 1] |= {"wall": w1 - w0, "wall_cpu": c1 - c0, "batches": epochs.train[e][0]}
        tasks[e - 1]["batches_cpu"] = epochs.train[e][1]
    return {
        "label": label,
        "config": config,
        "fit_s": t.wall,
        "matmul_gflops": rates,
        "tasks": tasks,
        "init_row": dict(timer.init_row),
        "flops": counter.flops,
        "products_s": products,
        "every_n": every,
        "checkpoint_every": ckpt_every,
        "probes": probes,
    }


PHASES = ("data", "training", "episodes", *MONITOR_NAMES, "checkpoint", "callbacks", "loop")


def phases(task: dict[str, float], cpu: bool) -> dict[str, float]:
    """A timed task's seconds by phase, in CPU seconds of the process (``cpu``) or wall seconds; the stream's task
    generation is counted once, as ``data`` (its wall seconds), and taken out of the phase it ran in."""
    sfx = "_cpu" if cpu else ""
    gen = {k: v for k, v in task.items() if k.startswith("gen_")}
    out = {"data": sum(gen.values())}
    for key in ("training", "episodes", *MONITOR_NAMES, "checkpoint", "callbacks"):
        parts = (key, "episodes_probe") if key == "episodes" else (key,)
        out[key] = sum(task.get(k + sfx, 0.0) - gen.get(f"gen_{k}", 0.0) for k in parts)
    out["training"] = task.get("batches" + sfx, 0.0) - gen.get("gen_training", 0.0)  # step, backward, optimiser
    out["loop"] = task.get("wall" + sfx, 0.0) - sum(out.values())
    return out


def summarise(m: dict[str, Any], cpu: bool = True) -> dict[str, Any]:
    """Steady phases, the per-task cost at the configured cadence, the floor and the ratio (CPU or wall seconds)."""
    steady = [phases(v, cpu) for t, v in m["tasks"].items() if t >= 1]
    first = phases(m["tasks"][0], cpu)
    mean = {k: statistics.fmean(s[k] for s in steady) for k in PHASES}
    spans = [sum(s.values()) for s in steady]
    amortised = dict(mean)
    for name in MONITOR_NAMES:  # what task 0 costs above a steady task, at the monitor's cadence
        every = m["every_n"].get(name)
        if every:  # a monitor that runs every task does its extra work at the probe rows only (figures, metrics)
            share = 1 / every if every > 1 else m["probes"] / PAPER_TASKS
            amortised[name] += max(0.0, first[name] - mean[name]) * share
    # the accuracy-matrix rows: task 0's probe row above a steady task's episodes, and the initial row, per task
    init_row = m["init_row"].get("init_row_cpu" if cpu else "init_row", 0.0)
    rows = max(0.0, first["episodes"] - mean["episodes"]) * m["probes"] + init_row
    amortised["episodes"] += rows / PAPER_TASKS
    rate = max(r[1 if cpu else 0] for r in m["matmul_gflops"])
    floor = (m["flops"]["training"] + m["flops"]["episodes"]) / (rate * 1e9)
    cost = sum(amortised.values())
    products = sum(m["products_s"].values()) if cpu else float("nan")  # timed in CPU seconds
    return {
        "steady": mean,
        "steady_range": (min(spans), max(spans)),
        "task0": first,
        "amortised": amortised,
        "cost_s": cost,
        "floor_s": floor,
        "ratio": cost / floor if floor > 0 else float("nan"),
        "products_s": products,
        "rate_gflops": (min(r[1 if cpu else 0] for r in m["matmul_gflops"]), rate),
        "dominant": max(amortised, key=lambda k: amortised[k]),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Fit each learner, print the cost table, return the measurements."""
    p = parser(__doc__)
    p.add_argument("--learners", nargs="+", default=list(LEARNERS), choices=list(LEARNERS))
    p.add_argument("--tasks", type=int, default=2, help="steady tasks timed per learner")
    p.add_argument("--set", nargs="*", default=[], help="CLI overrides without the leading --, for every learner")
    bench = Bench.start("pmnist_task_cost", p, argv)
    args = bench.args
    if args.small:
        args.tasks = min(args.tasks, 1)
    runs: dict[str, Any] = {}
    for _ in range(args.repeats):
        for name in args.learners:
            runs.setdefault(name, []).append(fit(name, args))
    rows, result = [], {}
    for name, fits in runs.items():
        cpu = [summarise(m) for m in fits]
        wall = [summarise(m, cpu=False) for m in fits]
        best = min(cpu, key=lambda s: s["cost_s"])
        result[name] = {"fits": fits, "cpu": cpu, "wall": wall}
        flops = fits[0]["flops"]
        rows.append(
            [
                fits[0]["label"],
                best["cost_s"],
                f"{min(s['steady_range'][0] for s in cpu):.3g}–{max(s['steady_range'][1] for s in cpu):.3g}",
                min(s["cost_s"] for s in wall),
                f"{flops['training'] / 1e9:.3g} + {flops['episodes'] / 1e9:.3g}",
                best["floor_s"],
                best["products_s"],
                best["ratio"],
                *(best["amortised"][k] for k in PHASES),
                best["dominant"],
            ]
        )
    columns = ["learner", "CPU s/task", "steady range", "wall s/task", "GFLOP (train + eval)", "floor s"]
    columns += ["products s", "ratio"]
    columns += [*PHASES, "dominant"]
    rates = [r for fits in runs.values() for m in fits for r in m["matmul_gflops"]]
    notes = [
        f"{args.tasks} steady task(s) per fit, {args.repeats} fit(s) per learner (the cheapest kept). CPU seconds of "
        "the one-thread process (what a shared machine distorts least); s/task at the configured cadence (each "
        "monitor's every_n_tasks; the 10 probe rows and the initial row over 7,500 tasks); steady range: CPU seconds "
        "of the steady tasks as timed; floor: the counted training + evaluation flops at the best 2048² matmul rate "
        f"per CPU second of the same process ({min(r[1] for r in rates):.0f}–{max(r[1] for r in rates):.0f} GFLOP "
        f"per CPU s; per wall s {min(r[0] for r in rates):.0f}–{max(r[0] for r in rates):.0f}); products: the "
        "counted task's products, each operand layout timed alone (CPU s); phases in CPU "
        "seconds per task (data: wall seconds of task generation; loop: the task's span less every phase)."
    ]
    return bench.finish(result, columns, rows, notes)


if __name__ == "__main__":
    main()
