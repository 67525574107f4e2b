"""Paper-size tasks of any config, timed phase by phase against this machine's flop floor.

Runs the first ``--tasks`` tasks of a config at its full size (default: QOA V1 on Permuted MNIST, 7,500 tasks of
58,000 images, every monitor on) in one ``Trainer.fit`` and prints:

- task 0 apart (the buffer fills, so it barely trains): the accuracy matrix's initial row and the probe row after
  task 0, each beside the time of the episodes it contains, and the monitors that run at task 0;
- steady tasks (1 … N−1): seconds per task split into training, evaluation episodes, monitors, checkpoints and the
  rest (data, loop); ms per training step; the scorer's achieved GFLOP/s in training and in evaluation (flops
  counted from the (query, support) pairs each scorer call sees);
- a 2048² matmul measured before and after the tasks (fp32 on CPU, bf16 on CUDA), the flop floor of a steady task
  at that rate and the ratio to it; peak RSS at the end of the fit (and CUDA peak memory), with the peak of each
  phase (training, episodes, each monitor, ...) sampled every 10 ms; the projected 7,500-task time (steady tasks,
  plus the probe rows, the initial row and the monitors at their configured frequencies).

    python -m benchmarks.paper_size                               # 3 tasks of configs/qoa_pmnist.yaml, 2 threads
    python -m benchmarks.paper_size --tasks 4 --config configs/qoa_pmnist.yaml --set model.init_args.online_queries=2
    python -m benchmarks.paper_size --gpu                         # CUDA, bf16-mixed: the GPU benchmark
    python -m benchmarks.paper_size --gpu --device cpu --small    # the GPU code path on CPU, tiny sizes (tests)
    python -m benchmarks.paper_size --set model.init_args.compile=true    # QOA's training step compiled

It only uses the CLI and Lightning hooks, so ``PYTHONPATH=<another checkout>`` times that checkout's code with the
same yardstick (interleave runs to compare on a shared machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from benchmarks.harness import Bench, clock, matmul_gflops, parser, sync
from cl_lightning.callbacks import CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor
from cl_lightning.contract import EvalBatch
from cl_lightning.run.cli import main as cli_main

MONITORS = (ForgettingMonitor, PlasticityMonitor, HessianMonitor, CostMonitor)
MONITOR_NAMES = tuple(m.__name__ for m in MONITORS)
HOOKS = (
    "on_fit_start",
    "on_train_epoch_start",
    "on_train_epoch_end",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_validation_start",
    "on_validation_epoch_start",
    "on_validation_epoch_end",
    "on_validation_batch_end",
    "on_validation_end",
    "on_save_checkpoint",
    "on_fit_end",
)
SMALL = [  # --small: the same code path at a size a test can afford
    "--data.stream.init_args.num_tasks=20",
    "--data.stream.init_args.train_size=1200",
    "--data.stream.init_args.query_size=200",
    "--data.eval_queries=100",
    "--data.context_size=100",
    "--model.init_args.memory_size=1000",
    "--model.init_args.support_size=100",
]


def _status_kb(*fields: str) -> list[int]:
    values = dict.fromkeys(fields, 0)
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in values:
                values[key] = int(line.split()[1])
    return [values[k] for k in fields]


class MemorySampler(threading.Thread):
    """Peak anonymous memory (``RssAnon``: the process's own tensors and heap, not the shared library pages that
    ``VmRSS`` also counts) and the peak ``VmRSS`` of each phase of a :class:`PhaseTimer` (training, episodes, a
    monitor's name, ...), read from ``/proc/self/status`` every 10 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_anon_kb, self.stopped = 0, threading.Event()
        self.timer: PhaseTimer | None = None  # set once the Trainer exists; its ``phase`` labels the samples
        self.peak_rss_kb: dict[str, int] = defaultdict(int)

    def run(self) -> None:
        """Sample until stopped."""
        while not self.stopped.wait(0.01):
            rss, anon = _status_kb("VmRSS", "RssAnon")
            self.peak_anon_kb = max(self.peak_anon_kb, anon)
            phase = self.timer.phase if self.timer is not None else "matmul yardstick"
            self.peak_rss_kb[phase] = max(self.peak_rss_kb[phase], rss)


class PhaseTimer(Callback):
    """Times every hook of the other callbacks and the learner's steps, and counts the scorer's flops.

    Installed by :func:`run`: it wraps (on the instances) the training and validation steps of the learner and the
    overridden hooks of every callback, so each second lands in one bucket per task: ``training``, ``episodes``,
    a monitor's name (``init_row`` for the ForgettingMonitor's fit-start pass), ``checkpoint`` or ``callbacks``.
    """

    def __init__(self, stop_after: int, device: torch.device) -> None:
        self.stop_after, self.device = stop_after, device
        self.tasks: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.init_row: dict[str, float] = defaultdict(float)
        self.phase = "other"
        self.epoch_start, self.epoch_cpu = 0.0, 0.0

    def wrap(self, owner: Any, name: str, label: str | Callable[[tuple], str], trainer: Trainer) -> None:
        """Replace ``owner.name`` by a timed call adding its seconds to ``label`` of the running task."""
        fn = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            key = label(args) if callable(label) else label
            outer, self.phase = self.phase, key
            try:
                with clock(self.device) as t:
                    out = fn(*args, **kwargs)
            finally:
                self.phase = outer
            bucket = self.init_row if key == "init_row" else self.tasks[trainer.current_epoch]
            bucket[key] += t.wall
            bucket[key + "_cpu"] += t.cpu
            if key == "training":
                bucket["steps"] += 1
                bucket["updates"] += out is not None
            elif key.startswith("episodes"):
                bucket[key + "_n"] += 1
            return out

        setattr(owner, name, timed)

    def install(self, trainer: Trainer, model: LightningModule, stream: Any, scorer_flops: bool = True) -> None:
        """Wrap the learner's steps, every callback's overridden hooks, and (``scorer_flops``) hook the scorer for
        flop counts (a forward hook: the fused step engine refuses a hooked learner)."""
        self.wrap(model, "training_step", "training", trainer)
        self.wrap(
            model, "validation_step", lambda args: "episodes_probe" if _is_probe(args[0]) else "episodes", trainer
        )
        for cb in trainer.callbacks:
            if cb is self:
                continue
            if isinstance(cb, MONITORS):
                label = type(cb).__name__
            elif isinstance(cb, ModelCheckpoint):
                label = "checkpoint"
            else:
                label = "callbacks"
            for hook in HOOKS:
                if getattr(type(cb), hook, None) is not getattr(Callback, hook):
                    self.wrap(
                        cb,
                        hook,
                        "init_row" if isinstance(cb, ForgettingMonitor) and hook == "on_fit_start" else label,
                        trainer,
                    )
        generate = stream.generate

        def timed_generate(task: int) -> Any:  # task generation, wherever it happens (loaders, monitors)
            start = time.perf_counter()
            try:
                return generate(task)
            finally:
                key = "gen_init_row" if self.phase == "init_row" else f"gen_{self.phase}"
                bucket = self.init_row if self.phase == "init_row" else self.tasks[trainer.current_epoch]
                bucket[key] += time.perf_counter() - start

        stream.generate = timed_generate
        try:  # the evaluation block size is measured on first use: time it apart (absent from older checkouts)
            from cl_lightning.nn import scorers
        except ImportError:  # pragma: no cover
            return
        tune = getattr(scorers, "tuned_block_pairs", None)
        if tune is not None:

            def timed_tune(*args: Any) -> int:
                start = time.perf_counter()
                try:
                    return tune(*args)
                finally:
                    bucket = self.init_row if self.phase == "init_row" else self.tasks[trainer.current_epoch]
                    bucket["autotune"] += time.perf_counter() - start

            scorers.tuned_block_pairs = timed_tune
        scorer = getattr(model, "scorer", None)
        if scorer_flops and isinstance(scorer, torch.nn.Module):
            scorer.register_forward_hook(self._count_flops(scorer, trainer), with_kwargs=False)

    def _count_flops(self, scorer: torch.nn.Module, trainer: Trainer) -> Callable:
        hidden = [m for m in scorer.modules() if isinstance(m, torch.nn.Linear)]
        first, rest = hidden[0], hidden[1:]
        per_pair = sum(2 * m.in_features * m.out_features for m in rest) + first.out_features  # + the broadcast add
        side = 2 * first.in_features * first.out_features  # factorised first layer, per query and per support (≈)

        @torch.compiler.disable  # bookkeeping: a compiled training step must not trace (and guard on) it
        def hook(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
            q, s = args[0].shape[0], args[1].shape[0]
            flops = per_pair * q * s + side * (q + s)
            grad = out.requires_grad
            key = "init_row" if self.phase == "init_row" else self.phase
            bucket = self.init_row if key == "init_row" else self.tasks[trainer.current_epoch]
            bucket[f"flops_{key}"] += flops * (3 if grad else 1)  # backward ≈ twice the forward

        return hook

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start the task's wall clock."""
        sync(self.device)
        self.epoch_start, self.epoch_cpu = time.perf_counter(), time.process_time()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Close the task's wall clock (validation runs before this hook) and stop after ``stop_after`` tasks."""
        sync(self.device)
        self.tasks[trainer.current_epoch]["wall"] = time.perf_counter() - self.epoch_start
        self.tasks[trainer.current_epoch]["wall_cpu"] = time.process_time() - self.epoch_cpu
        if trainer.current_epoch + 1 >= self.stop_after:
            trainer.should_stop = True


def _is_probe(batch: EvalBatch) -> bool:
    return any(slot.role == "matrix" for slot in batch.slots)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fit ``args.tasks`` tasks of the config and return the measurements."""
    device = torch.device(args.device)
    mm_dtype = torch.bfloat16 if args.gpu and device.type == "cuda" else torch.float32
    cli_args = ["--config", args.config, *[a for o in args.overlays for a in ("--config", o)]]
    if args.small:
        cli_args += SMALL
    if not args.keep_lag:  # every steady task then has its forward and backward episode from task 1 on
        cli_args += ["--data.backward_lag=1"]
    cli_args += [f"--{kv}" for kv in args.set]
    cli_args += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    if args.gpu:
        accel = "gpu" if device.type == "cuda" else "cpu"
        cli_args += [f"--trainer.accelerator={accel}", f"--trainer.precision={args.precision}"]
    else:
        cli_args += ["--trainer.accelerator=cpu"]
    load_before = os.getloadavg()[0]
    import_rss_kb, import_anon_kb = _status_kb("VmRSS", "RssAnon")  # torch + Lightning imported, nothing run
    memory = MemorySampler()
    memory.start()
    mm_n = 256 if args.small else 2048  # the yardstick at --small: seconds, not a measurement
    mm_before = [matmul_gflops(device, mm_dtype, n=mm_n) for _ in range(2)]
    with tempfile.TemporaryDirectory() as root:
        cli = cli_main(
            [*cli_args, f"--trainer.logger.init_args.save_dir={root}", f"--trainer.default_root_dir={root}"],
            run=False,
        )
        trainer, model, dm = cli.trainer, cli.model, cli.datamodule
        timer = PhaseTimer(args.tasks, device)
        trainer.callbacks.insert(0, timer)  # its epoch clock starts before the monitors
        timer.install(trainer, model, dm.stream)
        memory.timer = timer
        dm.prepare_data()
        with clock(device) as fit:
            trainer.fit(model, dm)
        total = fit.wall
        memory.timer = None
    rss_mb = _status_kb("VmHWM")[0] / 1024  # the run's peak, before the yardstick's own 3 × 16 MB matrices
    mm_after = [matmul_gflops(device, mm_dtype, n=mm_n) for _ in range(2)]
    memory.stopped.set()
    memory.join()
    return {
        "config": args.config,
        "matmul_n": mm_n,
        "load": (load_before, os.getloadavg()[0]),
        "tasks": {t: dict(v) for t, v in timer.tasks.items()},
        "init_row": dict(timer.init_row),
        "total_s": total,
        "matmul_gflops": mm_before + mm_after,
        "peak_rss_mb": rss_mb,
        "import_rss_mb": import_rss_kb / 1024,
        "import_anon_mb": import_anon_kb / 1024,
        "peak_anon_mb": max(memory.peak_anon_kb, _status_kb("RssAnon")[0]) / 1024,
        "peak_rss_by_phase_mb": {k: v / 1024 for k, v in sorted(memory.peak_rss_kb.items(), key=lambda kv: -kv[1])},
        "cuda_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
        "num_tasks": dm.num_tasks,
        "num_probe": len(dm.probe_tasks),
        "threads": torch.get_num_threads(),
        "every_n": {
            type(c).__name__: getattr(c, "every_n_tasks", 1) for c in trainer.callbacks if isinstance(c, MONITORS)
        },
        "chunks_per_task": dm.stream.num_chunks,
    }


def report(m: dict[str, Any]) -> str:
    """The printed table."""
    rates = [r[0] for r in m["matmul_gflops"]]
    rate, cpu_rate = max(rates), max(r[1] for r in m["matmul_gflops"])
    lines = [
        f"{m['config']}: {len(m['tasks'])} tasks of {m['num_tasks']}, {m['threads']} threads, "
        f"total {m['total_s']:.1f} s, load average {m['load'][0]:.1f} → {m['load'][1]:.1f}",
        f"matmul {m['matmul_n']}²: {min(rates):.0f}–{rate:.0f} GFLOP/s, {cpu_rate:.0f} GFLOP per CPU second "
        "(floor at the best)",
    ]
    monitors = MONITOR_NAMES
    init = m["init_row"]
    t0 = m["tasks"].get(0, {})
    ep_s = _episode_seconds(m)
    if init.get("init_row"):
        k = m["num_probe"]
        gen = init.get("gen_init_row", 0.0) + init.get("autotune", 0.0)
        lines.append(
            f"initial row: {init['init_row']:.2f} s for {k} episodes, {gen:.2f} s of it generating their tasks "
            f"and measuring the block size ({init.get('autotune', 0.0):.2f} s) "
            f"(computing: {(init['init_row'] - gen) / k:.2f} s per episode; a steady episode: {ep_s:.2f} s)"
        )
    if t0:
        n_probe = t0.get("episodes_probe_n", 0)
        if n_probe:
            lines.append(
                f"task 0 probe row: {t0['episodes_probe']:.2f} s for {n_probe:.0f} episodes "
                f"({t0['episodes_probe'] / n_probe:.2f} s each; generating its tasks in the loader: "
                f"{t0.get('gen_other', 0.0):.2f} s more)"
            )
        mons = ", ".join(f"{n} {t0[n]:.2f} s" for n in monitors if t0.get(n))
        lines.append(
            f"task 0: wall {t0.get('wall', 0):.1f} s, training {t0.get('training', 0):.1f} s "
            f"({t0.get('updates', 0):.0f} updates), monitors: {mons}"
        )
    steady = [v for t, v in m["tasks"].items() if t > 0 and "wall" in v]
    if not steady:
        lines.append("no steady task (run --tasks >= 2)")
        return "\n".join(lines)

    def mean(key: str) -> float:
        return statistics.fmean(v.get(key, 0.0) for v in steady)

    wall, train, eps = mean("wall"), mean("training"), mean("episodes") + mean("episodes_probe")
    mon = sum(mean(n) for n in monitors)
    ckpt, cbs = mean("checkpoint"), mean("callbacks")
    rest = wall - train - eps - mon - ckpt - cbs
    updates = mean("updates")
    tr_flops, ev_flops = mean("flops_training"), mean("flops_episodes") + mean("flops_episodes_probe")
    floor = (tr_flops + ev_flops) / (rate * 1e9)
    walls = [v["wall"] for v in steady]
    lines += [
        f"steady tasks (1..{len(steady)}): {wall:.2f} s per task (range {min(walls):.2f}–{max(walls):.2f})",
        f"  training {train:.2f} s ({1e3 * train / max(1, mean('steps')):.1f} ms per chunk, "
        f"{updates:.0f} updates), evaluation episodes {eps:.2f} s ({mean('episodes_n'):.0f} episodes), "
        f"monitors {mon:.2f} s, checkpoints {ckpt:.2f} s, other callbacks {cbs:.2f} s, rest (data, loop) {rest:.2f} s",
        f"  scorer: training {tr_flops / 1e9:.1f} GFLOP at {tr_flops / max(train, 1e-9) / 1e9:.0f} GFLOP/s, "
        f"evaluation {ev_flops / 1e9:.0f} GFLOP at {ev_flops / max(eps, 1e-9) / 1e9:.0f} GFLOP/s "
        f"({ev_flops / max(eps, 1e-9) / 1e9 / rate:.2f} of the matmul rate)",
        f"  flop floor {floor:.2f} s per task; ratio {wall / floor:.2f}" if floor > 0 else "  no scorer flops counted",
    ]
    if floor > 0:  # the same in CPU seconds of this process: what a busy shared machine distorts least
        cpu_floor = (tr_flops + ev_flops) / (cpu_rate * 1e9)
        eps_cpu = mean("episodes_cpu") + mean("episodes_probe_cpu")
        lines.append(
            f"  in CPU seconds: task {mean('wall_cpu'):.2f}, training {mean('training_cpu'):.2f}, episodes "
            f"{eps_cpu:.2f} ({ev_flops / 1e9 / max(eps_cpu, 1e-9):.0f} GFLOP per CPU s); floor {cpu_floor:.2f}; "
            f"ratio {mean('wall_cpu') / cpu_floor:.2f}"
        )
    # 7,500-task projection: every task steady; plus the probe rows beyond a steady task's 2 episodes, the initial
    # row and the monitors at their frequencies (their per-call cost taken at task 0, where all of them run).
    n, k = m["num_tasks"], m["num_probe"]
    extra = 0.0
    if t0.get("episodes_probe_n"):
        extra += k * max(0.0, t0["episodes_probe"] - 2 * ep_s)
    extra += init.get("init_row", 0.0)
    for name in monitors:
        every = m["every_n"].get(name)
        if every and every > 1 and t0.get(name):
            extra += (n / every) * max(0.0, t0[name] - mean(name))
    projected = n * wall + extra
    peak = (  # VmHWM counts every resident page, shared library code included; RssAnon only the process's own
        f"peak RSS {m['peak_rss_mb']:.0f} MB (VmHWM, every resident page; {m['import_rss_mb']:.0f} MB were resident "
        f"after importing torch and Lightning, {m['import_rss_mb'] - m['import_anon_mb']:.0f} MB of it shared library "
        f"pages, so the run added {m['peak_rss_mb'] - m['import_rss_mb']:.0f} MB); peak anonymous memory (RssAnon, "
        f"sampled every 10 ms) {m['peak_anon_mb']:.0f} MB, {m['peak_anon_mb'] - m['import_anon_mb']:.0f} MB above "
        "the imports"
    )
    if m["cuda_peak_mb"] is not None:
        peak += f", CUDA peak {m['cuda_peak_mb']:.0f} MB"
    if m.get("peak_rss_by_phase_mb"):  # where the peak happens ("other": the loop, data, Lightning between hooks)
        peak += "\n  peak RSS by phase (sampled): " + ", ".join(
            f"{k} {v:.0f}" for k, v in m["peak_rss_by_phase_mb"].items()
        )
    lines += [peak, f"projected {n:,}-task time: {projected / 3600:.2f} h ({projected / n:.2f} s per task)"]
    return "\n".join(lines)


def _episode_seconds(m: dict[str, Any]) -> float:
    steady = [v for t, v in m["tasks"].items() if t > 0 and v.get("episodes_n")]
    if not steady:
        t0 = m["tasks"].get(0, {})
        n = t0.get("episodes_n", 0) + t0.get("episodes_probe_n", 0)
        return (t0.get("episodes", 0) + t0.get("episodes_probe", 0)) / n if n else float("nan")
    return statistics.fmean(v["episodes"] / v["episodes_n"] for v in steady)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run, print the report, and return the measurements."""
    p = parser(__doc__, threads=2)
    p.add_argument("--config", default="configs/qoa_pmnist.yaml")
    p.add_argument("--overlays", nargs="*", default=[], help="configs applied after --config")
    p.add_argument("--tasks", type=int, default=3, help="tasks to run (task 0 is reported apart)")
    p.add_argument(
        "--set", nargs="*", default=[], help="CLI overrides without the leading --, e.g. model.init_args.x=1"
    )
    p.add_argument("--gpu", action="store_true", help="the GPU benchmark: accelerator gpu, --precision, bf16 matmul")
    p.add_argument("--device", default=None, help="device of the matmul yardstick (default: cuda with --gpu)")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument(
        "--keep-lag",
        action="store_true",
        help="keep the config's backward lag (default: lag 1, so tasks 1.. already have both episodes; the cost of an "
        "episode does not depend on the lag, only its task's regeneration when it left the stream's cache, ~0.1 s)",
    )
    bench = Bench.start("paper_size", p, argv)
    args = bench.args
    if args.device is None:
        args.device = "cuda" if args.gpu else "cpu"
    m = run(args)
    steady = [v for t, v in m["tasks"].items() if t > 0 and "wall" in v]
    keys = ("wall", "training", "episodes", "episodes_probe", "checkpoint", "callbacks", *MONITOR_NAMES)
    rows = [[k, statistics.fmean(v.get(k, 0.0) for v in steady)] for k in keys] if steady else []
    return bench.finish(m, ["phase (steady task mean)", "s"], rows, [report(m)])


if __name__ == "__main__":
    main()
