"""Forward, backward and *unseen-permutation* accuracy against training steps, for any Permuted-MNIST config.

Query-only attention keeps what it learned only if its learned score transfers across permutations: then its
accuracy on a permutation it never trained on matches its forward accuracy, and its backward accuracy (task t − 5)
matches both. This script fits a config (plus overlays and ``--set`` overrides) through the package's CLI with the
metric monitors and checkpoints off, and every ``--every`` tasks logs the run's forward and backward accuracy and
the learner's accuracy on ``--unseen`` permutations of a stream with another seed (each an episode of the same
context and query sizes). Prints one row per probe; with ``--out``, also writes every task's forward and backward
accuracy to ``<out>/transfer_curves.tasks.csv``.

    python -m benchmarks.transfer_curves --overlays configs/quick.yaml configs/quick_qoa.yaml
    python -m benchmarks.transfer_curves --config configs/bp_pmnist.yaml --overlays configs/demo_pmnist.yaml \\
        --set data.stream.init_args.num_tasks=100 --out logs/curves/bp
    python -m benchmarks.transfer_curves --small    # 2 tasks of 400 images, probes after each (the smoke test)
"""

from __future__ import annotations

import csv
import math
import statistics
import tempfile
import time
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from benchmarks.harness import Bench, clock, parser
from cl_lightning.callbacks import CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor
from cl_lightning.contract import EvalSlot, metric_key
from cl_lightning.data import PermutedMNIST
from cl_lightning.run.cli import main as cli_main

MONITORS = (CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor, ModelCheckpoint)
FORWARD, BACKWARD = metric_key(EvalSlot("forward"), "acc"), metric_key(EvalSlot("backward"), "acc")
SMALL = [  # --small: the same code path at a size a test can afford
    "data.stream.init_args.num_tasks=2",
    "data.stream.init_args.train_size=400",
    "data.stream.init_args.query_size=100",
    "data.eval_queries=20",
    "data.context_size=50",
    "data.backward_lag=1",
    "data.num_probe_tasks=2",
]


class TransferProbe(Callback):
    """Every ``every`` tasks (and after the last): forward, backward and unseen-permutation accuracy.

    Args:
        unseen: A stream of the same shapes whose permutations the learner never trains on (another seed).
        tasks: Unseen tasks evaluated per probe.
        context_size: Context examples per episode (the data module's).
        queries: Held-out queries per episode.
        every: Tasks between probes.
    """

    def __init__(self, unseen: PermutedMNIST, tasks: int, context_size: int, queries: int, every: int) -> None:
        self.unseen, self.tasks, self.every = unseen, tasks, every
        self.context_size, self.queries = context_size, queries
        self.rows: list[dict[str, float]] = []
        self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Read the run's forward/backward metrics and score the unseen permutations."""
        task = trainer.current_epoch
        if (task + 1) % self.every and task + 1 != trainer.max_epochs:
            return
        accs = []
        was_training = pl_module.training
        pl_module.eval()
        with torch.no_grad():
            for t in range(self.tasks):
                ep = self.unseen.episode(t, self.context_size, self.queries)
                pred = pl_module.predict_episode(ep.context_x, ep.context_y, ep.query_x)
                accs.append(float((pred.argmax(-1) == ep.query_y).float().mean()))
        pl_module.train(was_training)
        metrics = trainer.callback_metrics
        row = {
            "task": task,
            "steps": (task + 1) * trainer.datamodule.stream.num_chunks,
            "forward": float(metrics.get(FORWARD, float("nan"))),
            "backward": float(metrics.get(BACKWARD, float("nan"))),
            "unseen": sum(accs) / len(accs),
            "seconds": time.perf_counter() - self.start,
        }
        self.rows.append(row)
        print(
            f"task {task:5d} steps {row['steps']:6d}  forward {row['forward']:.3f}  backward {row['backward']:.3f}  "
            f"unseen {row['unseen']:.3f}  {row['seconds']:.0f} s",
            flush=True,
        )  # progress while a long run goes; the table comes at the end


class TaskMetrics(Callback):
    """Forward and backward accuracy after every task (for last-10-task means)."""

    def __init__(self) -> None:
        self.forward: list[float] = []
        self.backward: list[float] = []

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Append this task's forward and backward accuracy (NaN before the lag is reached)."""
        metrics = trainer.callback_metrics
        self.forward.append(float(metrics.get(FORWARD, float("nan"))))
        self.backward.append(float(metrics.get(BACKWARD, float("nan"))))


def run(
    config: str, overlays: list[str], sets: list[str], every: int, unseen_tasks: int, root: str
) -> tuple[TransferProbe, TaskMetrics, float]:
    """Fit one config with the probes attached; returns them and the fit's wall time."""
    args = ["--config", config, *[a for o in overlays for a in ("--config", o)]]
    args += [f"--{s}" for s in sets]
    args += [
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={root}",
        f"--trainer.default_root_dir={root}",
    ]
    cli = cli_main(args, run=False)
    cli.trainer.callbacks[:] = [c for c in cli.trainer.callbacks if not isinstance(c, MONITORS)]
    dm = cli.datamodule
    s = dm.stream
    unseen = PermutedMNIST(
        num_tasks=unseen_tasks,
        image_size=s.image_size,
        train_size=s.train_size,
        query_size=s.query_size,
        chunk_size=s.chunk_size,
        seed=s.seed + 99_991,
    )
    probe = TransferProbe(unseen, unseen_tasks, dm.context_size, dm.eval_queries or s.query_size, every)
    per_task = TaskMetrics()
    cli.trainer.callbacks += [probe, per_task]
    dm.prepare_data()
    with clock() as t:
        cli.trainer.fit(cli.model, dm)
    return probe, per_task, t.wall


def _last10(values: list[float]) -> float:
    seen = [v for v in values[-10:] if not math.isnan(v)]
    return statistics.fmean(seen) if seen else math.nan


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Fit with the probes; the result holds the probe rows, every task's metrics and the last-10-task means."""
    p = parser(__doc__, threads=0)
    p.add_argument("--config", default="configs/qoa_pmnist.yaml")
    p.add_argument("--overlays", nargs="*", default=["configs/quick.yaml", "configs/quick_qoa.yaml"])
    p.add_argument("--set", dest="sets", nargs="*", default=[], help="overrides, e.g. model.init_args.lr=1e-3")
    p.add_argument("--every", type=int, default=10, help="tasks between probes")
    p.add_argument("--unseen", type=int, default=5, help="unseen permutations per probe")
    bench = Bench.start("transfer_curves", p, argv)
    args = bench.args
    if args.small:  # 2 tasks of 400 images, small episodes, 1 unseen task
        args.sets, args.every, args.unseen = [*SMALL, *args.sets], 1, 1
    with tempfile.TemporaryDirectory() as root:
        probe, per_task, seconds = run(args.config, args.overlays, args.sets, args.every, args.unseen, root)
    last10 = {"forward": _last10(per_task.forward), "backward": _last10(per_task.backward)}
    unseen = probe.rows[-1]["unseen"]
    notes = [
        f"last 10 tasks: forward {last10['forward']:.3f} backward {last10['backward']:.3f} "
        f"(gap {last10['forward'] - last10['backward']:+.3f}); unseen {unseen:.3f}; fit {seconds:.0f} s"
    ]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "transfer_curves.tasks.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["task", "forward", "backward"])
            writer.writerows(zip(range(len(per_task.forward)), per_task.forward, per_task.backward, strict=True))
    columns = list(probe.rows[0])
    rows = [[r[c] for c in columns] for r in probe.rows]
    result = {"probes": probe.rows, "forward": per_task.forward, "backward": per_task.backward, "last10": last10}
    return bench.finish({**result, "unseen": unseen, "fit_s": seconds}, columns, rows, notes)


if __name__ == "__main__":
    main()
