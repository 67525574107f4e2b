"""Slowly changing regression: does the output layer's init gain matter? (issue 34, point 7)

The authors' Backprop / CBP net on SCR (``common/codes/ffnn.py``) draws the output layer Kaiming-uniform with
``nonlinearity='linear'`` (gain 1); the package's ``init: kaiming`` uses the ReLU gain (√2) on every layer. This runs
``bp_scr`` (or ``cbp_scr``) + the authors' warm-up on the native step kernel twice per seed: as the package draws it,
and with the same draw's output weights divided by √2 (exactly the authors' distribution, the hidden layer and every
other draw unchanged), and reports each run's forward and backward MSE over the evaluated tasks.

    OMP_NUM_THREADS=1 python -m benchmarks.scr_output_init [--config bp_scr] [--seeds 20 30] [--tasks 35] [--out DIR]
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.cbp_kernel_paths import ROOT, _TaskMetrics
from benchmarks.harness import Bench, parser
from cl_lightning.run.compose import CALLBACK_SLOTS

COLUMNS = ["config", "seed", "output init", "evaluated tasks", "forward MSE", "backward MSE"]


def run(config: str, seed: int, tasks: int, small: bool, linear_output: bool, root: Path) -> list[dict[str, float]]:
    """One fit; each task's ``eval/*`` metrics."""
    from cl_lightning.run.cli import main

    size = ["--data.stream.init_args.train_size=300", "--data.stream.init_args.query_size=100"] if small else []
    args = [
        "--config", str(ROOT / f"configs/{config}.yaml"), "--config", str(ROOT / "configs/paper/scr_warmup.yaml"),
        f"--seed_everything={seed}", f"--data.stream.init_args.seed={seed}", f"--model.init_args.seed={seed}",
        f"--data.stream.init_args.num_tasks={tasks}", "--model.init_args.step_kernel=native", *size,
        "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", "--trainer.logger=false",
        "--trainer.enable_checkpointing=false", "--trainer.enable_model_summary=false",
        *[f"--callbacks.{name}=null" for name in CALLBACK_SLOTS], f"--trainer.default_root_dir={root}",
    ]  # fmt: skip
    cli = main(args, run=False)
    if linear_output:  # Kaiming-uniform bound gain * sqrt(3 / fan_in): gain 1 instead of sqrt(2), the same draw
        with torch.no_grad():
            cli.model.net.layers[-1].weight.div_(math.sqrt(2))
    metrics = _TaskMetrics()
    cli.trainer.callbacks.append(metrics)
    cli.trainer.fit(cli.model, cli.datamodule)
    return metrics.tasks


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Both inits per seed; the mean forward and backward MSE over the evaluated tasks of each run."""
    p = parser(__doc__)
    p.add_argument("--config", default="bp_scr", choices=["bp_scr", "cbp_scr"])
    p.add_argument("--seeds", type=int, nargs="+", default=[20, 30])
    p.add_argument("--tasks", type=int, default=35, help="tasks in all, the 5 warm-up tasks included")
    bench = Bench.start("scr_output_init", p, argv)
    args = bench.args
    tasks, seeds = (7, args.seeds[:1]) if args.small else (args.tasks, args.seeds)
    root = Path(args.out or "/tmp") / "scr_output_init_fit"
    rows, runs = [], {}
    for seed in seeds:
        for linear in (False, True):
            per_task = run(args.config, seed, tasks, args.small, linear, root)
            fwd = [t["eval/forward_mse"] for t in per_task if "eval/forward_mse" in t]
            bwd = [t["eval/backward_mse"] for t in per_task if "eval/backward_mse" in t]
            name = "gain 1 (authors)" if linear else "ReLU gain (package)"
            runs[f"{seed} {name}"] = {"forward": fwd, "backward": bwd}
            mean = lambda v: f"{statistics.fmean(v):.4f}" if v else "-"  # noqa: E731
            rows.append([args.config, seed, name, len(fwd), mean(fwd), mean(bwd)])
    return bench.finish({"runs": runs, "tasks": tasks}, COLUMNS, rows)


if __name__ == "__main__":
    main()
