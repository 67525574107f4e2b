"""Wall-time cost of the metric monitors at the frequencies the configs set (target: at most 1.10x).

Runs one config (default: Backprop on Permuted MNIST with the quick overlay) twice in one process, once with the
config's callbacks minus the metric monitors and once with all of them, and prints the ratio. The two fits
alternate ``--repeats`` times and the fastest of each is kept, which damps the noise of a shared machine.

    python -m benchmarks.metric_overhead
    python -m benchmarks.metric_overhead --config configs/qoa_pmnist.yaml --tasks 20 --repeats 2
    python -m benchmarks.metric_overhead --config configs/qoa_pmnist.yaml --tasks 30 \\
        --overlays configs/quick.yaml configs/quick_qoa.yaml      # the README's main command
    python -m benchmarks.metric_overhead --each                   # and each monitor alone
    python -m benchmarks.metric_overhead --small --each           # 2 tasks of 400 images (the smoke test)
"""

from __future__ import annotations

import tempfile
from typing import Any

from benchmarks.harness import Bench, clock, interleave, parser
from cl_lightning.callbacks import CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor
from cl_lightning.run.cli import main as cli_main

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
    cli = cli_main(
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
    with clock() as t:
        cli.trainer.fit(cli.model, cli.datamodule)
    return t.wall


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time the fits with and without the monitors (interleaved, the fastest of each kept) and report the ratio."""
    p = parser(__doc__)
    p.add_argument("--config", default="configs/bp_pmnist.yaml")
    p.add_argument("--tasks", type=int, default=30, help="tasks of the quick run (the quick overlay's 30)")
    p.add_argument("--overlays", nargs="+", default=["configs/quick.yaml"], help="configs applied after --config")
    p.add_argument("--each", action="store_true", help="also time each monitor alone")
    bench = Bench.start("metric_overhead", p, argv)
    args = bench.args
    extra = SMALL if args.small else []
    tasks, repeats = (2, 1) if args.small else (args.tasks, args.repeats)
    variants: dict[str, tuple[type, ...]] = {"none": (), "all": MONITORS}
    if args.each:
        variants |= {m.__name__: (m,) for m in MONITORS}
    with tempfile.TemporaryDirectory() as root:
        seconds = interleave(
            {
                name: lambda keep=keep: timed_fit(args.config, tasks, keep, root, args.overlays, extra)
                for name, keep in variants.items()
            },
            repeats,
        )
    best = {name: min(v) for name, v in seconds.items()}
    ratio = {name: best[name] / best["none"] for name in variants}
    rows = [[name, best[name], ratio[name]] for name in variants]
    runs = f"{args.config} + {' + '.join(args.overlays)}, {tasks} tasks; the fastest of {repeats} fits each"
    notes = [runs, f"metric overhead ratio: {ratio['all']:.3f} (target <= 1.10)"]
    return bench.finish(
        {"seconds": seconds, "best_s": best, "ratio": ratio}, ["monitors", "fit s", "ratio"], rows, notes
    )


if __name__ == "__main__":
    main()
