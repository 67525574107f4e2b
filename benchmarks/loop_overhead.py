"""Cost of training through Lightning against a plain PyTorch loop doing the same steps (≤ 1.10x: docs/protocol.md §6).

Both loops run the config's Backprop learner and optimiser on the same chunks, in the same order, and accumulate
the same online metric; the Lightning run is ``Trainer.fit`` with the config's trainer, the progress bar on (as a
user sees it) and evaluation, checkpoints and monitors off. Two workloads matter:

- the paper's Backprop on Permuted MNIST (chunks of 400 into 49 -> 200x4 -> 10; the default here), where the
  target applies;
- slowly changing regression, one point per step into 20 -> 40 -> 1: a ~1 ms step, so it shows Lightning's fixed
  per-step cost (about a dozen hook calls and the optimiser closure) at its largest.

    python -m benchmarks.loop_overhead                                          # PMNIST, 2 tasks of 58,000
    python -m benchmarks.loop_overhead --config configs/bp_scr.yaml --train-size 2000   # SCR, chunk 1
    python -m benchmarks.loop_overhead --small                                   # 2 tasks of 800, once each
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
from typing import Any

import torch

from benchmarks.harness import Bench, clock, interleave, parser
from cl_lightning.run.cli import main as cli_main
from cl_lightning.run.compose import CALLBACK_SLOTS


def _cli(config: str, root: str, tasks: int, train_size: int | None, progress_bar: bool):
    size = [f"--data.stream.init_args.train_size={train_size}"] if train_size else []
    return cli_main(
        [
            "--config",
            config,
            f"--data.stream.init_args.num_tasks={tasks}",
            *size,
            "--trainer.callbacks=[]",
            *(f"--callbacks.{name}=null" for name in CALLBACK_SLOTS),  # the config's checkpoint and monitors
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_model_summary=false",
            f"--trainer.enable_progress_bar={str(progress_bar).lower()}",
            f"--trainer.default_root_dir={root}",
        ],
        run=False,
    )


def lightning_seconds(args: argparse.Namespace, root: str, progress_bar: bool) -> tuple[float, int]:
    """Seconds of ``Trainer.fit`` (training only) and the steps it took."""
    cli = _cli(args.config, root, args.tasks, args.train_size, progress_bar)
    cli.datamodule.prepare_data()
    with clock() as t, contextlib.redirect_stderr(io.StringIO()):  # the bar's output is not what is measured
        cli.trainer.fit(cli.model, cli.datamodule)
    return t.wall, cli.trainer.global_step


def plain_seconds(args: argparse.Namespace, root: str) -> tuple[float, int]:
    """Seconds of the same training in a bare loop (generate the task, then per chunk: predict, score, loss,
    backward, optimiser step) and the steps it took."""
    cli = _cli(args.config, root, args.tasks, args.train_size, False)
    model, stream = cli.model, cli.datamodule.stream
    optimizer = model.configure_optimizers()
    steps = 0
    with clock() as t:
        for task in range(args.tasks):
            total = torch.zeros((), dtype=torch.float64)
            for i in range(stream.num_chunks):
                x, y, _ = stream.chunk(task, i)
                pred = model.predict(x)
                loss = model.loss(pred, y)
                total += model.score(pred.detach(), y).double()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps += 1
    return t.wall, steps


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time both loops (interleaved, the fastest of ``--repeats`` kept) and report ms per step and their ratio."""
    p = parser(__doc__, repeats=2)
    p.add_argument("--config", default="configs/bp_pmnist.yaml", help="a Backprop config")
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--train-size", type=int, default=None, help="examples per task (default: the config's)")
    bench = Bench.start("loop_overhead", p, argv)
    args = bench.args
    if args.small:
        args.tasks, args.train_size, args.repeats = 2, 800, 1
    with tempfile.TemporaryDirectory() as root:
        runs = interleave(
            {
                "plain": lambda: plain_seconds(args, root),
                "lightning": lambda: lightning_seconds(args, root, True),
                "lightning, no bar": lambda: lightning_seconds(args, root, False),
            },
            args.repeats,
        )
    steps = {run[1] for results in runs.values() for run in results}
    assert len(steps) == 1, f"the loops took different numbers of steps: {steps}"
    n = steps.pop()
    ms = {name: 1e3 * min(s for s, _ in results) / n for name, results in runs.items()}
    ratio = {name: ms[name] / ms["plain"] for name in ms}
    rows = [[name, ms[name], ratio[name]] for name in ms]
    notes = [
        f"{args.config}, {args.tasks} tasks, {n} steps; target: lightning / plain <= 1.10",
    ]
    return bench.finish({"steps": n, "ms_per_step": ms, "ratio": ratio}, ["loop", "ms/step", "ratio"], rows, notes)


if __name__ == "__main__":
    main()
