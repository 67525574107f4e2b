"""Wall-time cost of the metric monitors at the frequencies the configs set (target: at most 1.10x).

Runs one config (default: Backprop on Permuted MNIST with the quick overlay) twice in one process, once with the
config's callbacks minus the metric monitors and once with all of them, and prints the ratio. The two fits
alternate ``--repeats`` times and the fastest of each is kept, which damps the noise of a shared machine.

    python benchmarks/metric_overhead.py
    python benchmarks/metric_overhead.py --config configs/qoa_pmnist.yaml --tasks 20 --repeats 2
    python benchmarks/metric_overhead.py --config configs/qoa_pmnist.yaml --tasks 30 \\
        --overlays configs/quick.yaml configs/quick_qoa.yaml      # the README's main command
    python benchmarks/metric_overhead.py --each                   # and each monitor alone
    python benchmarks/metric_overhead.py --small --each           # 2 tasks of 400 images (the smoke test)
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from cl_lightning.callbacks import CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor
from cl_lightning.cli import main

MONITORS = (CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor)
SMALL = [  # --small: every monitor's code path at a size a test can afford
    "--data.stream.init_args.train_size=400",
    "--data.stream.init_args.query_size=100",
    "--data.eval_queries=50",
    "--data.num_probe_tasks=2",
]


def timed_fit(
    config: str, tasks: int, keep: tuple[type, ...], root: str, overlays: list[str], extra: list[str]
) -> float:
    """Seconds of one ``Trainer.fit`` of the quick config with only the monitors in ``keep`` (construction and data
    loading excluded); ``extra``: further CLI arguments."""
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
            *extra,
        ],
        run=False,
    )
    dropped = tuple(m for m in MONITORS if m not in keep)
    cli.trainer.callbacks[:] = [c for c in cli.trainer.callbacks if not (dropped and isinstance(c, dropped))]
    for monitor in keep:
        assert any(isinstance(c, monitor) for c in cli.trainer.callbacks), f"config has no {monitor.__name__}"
    cli.datamodule.prepare_data()
    start = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    return time.perf_counter() - start


def main_benchmark(argv: list[str] | None = None) -> None:
    """Parse the arguments, time both fits and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bp_pmnist.yaml")
    parser.add_argument("--tasks", type=int, default=30, help="tasks of the quick run (the quick overlay's 30)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--overlays", nargs="+", default=["configs/quick.yaml"], help="configs applied after --config")
    parser.add_argument("--each", action="store_true", help="also time each monitor alone")
    parser.add_argument("--small", action="store_true", help="2 tasks of 400 images, small episodes (the smoke test)")
    args = parser.parse_args(argv)
    extra = SMALL if args.small else []
    if args.small:
        args.tasks, args.repeats = 2, 1
    torch.set_num_threads(1)
    variants: dict[str, tuple[type, ...]] = {"none": (), "all": MONITORS}
    if args.each:
        variants |= {m.__name__: (m,) for m in MONITORS}
    best = dict.fromkeys(variants, float("inf"))
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.repeats):
            for name, keep in variants.items():
                best[name] = min(best[name], timed_fit(args.config, args.tasks, keep, root, args.overlays, extra))
    runs = f"{args.config} + {' + '.join(args.overlays)}, {args.tasks} tasks"
    print(f"{runs}: without monitors {best['none']:.1f} s, with {best['all']:.1f} s")
    for name in variants:
        if name not in ("none", "all"):
            print(f"  {name} alone: {best[name]:.1f} s, ratio {best[name] / best['none']:.3f}")
    print(f"metric overhead ratio: {best['all'] / best['none']:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main_benchmark()
