"""Wall-time cost of the metric monitors at the frequencies the configs set (target: at most 1.10x).

Runs one config (default: Backprop on Permuted MNIST with the quick overlay) twice in one process, once with the
config's callbacks minus the metric monitors and once with all of them, and prints the ratio. The two fits
alternate ``--repeats`` times and the fastest of each is kept, which damps the noise of a shared machine.

    python benchmarks/metric_overhead.py
    python benchmarks/metric_overhead.py --config configs/qoa_pmnist.yaml --tasks 20 --repeats 2
    python benchmarks/metric_overhead.py --config configs/qoa_pmnist.yaml --tasks 30 \\
        --overlays configs/quick.yaml configs/quick_qoa.yaml      # the README's main command
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from cl_lightning.callbacks import CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor
from cl_lightning.cli import main

MONITORS = (CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor)


def timed_fit(config: str, tasks: int, with_monitors: bool, root: str, overlays: list[str]) -> float:
    """Seconds of one ``Trainer.fit`` of the quick config (construction and data loading excluded)."""
    cli = main(
        [
            "--config",
            config,
            *[arg for overlay in overlays for arg in ("--config", overlay)],
            f"--data.stream.init_args.num_tasks={tasks}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={root}",
            f"--trainer.default_root_dir={root}",
        ],
        run=False,
    )
    if not with_monitors:
        cli.trainer.callbacks[:] = [c for c in cli.trainer.callbacks if not isinstance(c, MONITORS)]
    assert with_monitors == any(isinstance(c, MONITORS) for c in cli.trainer.callbacks), "config has no monitors"
    cli.datamodule.prepare_data()
    start = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    return time.perf_counter() - start


def main_benchmark() -> None:
    """Parse the arguments, time both fits and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bp_pmnist.yaml")
    parser.add_argument("--tasks", type=int, default=20, help="tasks of the quick run (10-task multiples)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--overlays", nargs="+", default=["configs/quick.yaml"], help="configs applied after --config")
    args = parser.parse_args()
    torch.set_num_threads(1)
    best = {False: float("inf"), True: float("inf")}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.repeats):
            for with_monitors in (False, True):
                seconds = timed_fit(args.config, args.tasks, with_monitors, root, args.overlays)
                best[with_monitors] = min(best[with_monitors], seconds)
    ratio = best[True] / best[False]
    runs = f"{args.config} + {' + '.join(args.overlays)}, {args.tasks} tasks"
    print(f"{runs}: without monitors {best[False]:.1f} s, with {best[True]:.1f} s")
    print(f"metric overhead ratio: {ratio:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main_benchmark()
