"""Cost of training through Lightning against a plain PyTorch loop doing the same steps (≤ 1.10x: docs/protocol.md §6).

Both loops run the config's Backprop learner and optimiser on the same chunks, in the same order, and accumulate
the same online metric; the Lightning run is ``Trainer.fit`` with the config's trainer, the progress bar on (as a
user sees it) and evaluation, checkpoints and monitors off. Two workloads matter:

- the paper's Backprop on Permuted MNIST (chunks of 400 into 49 -> 200x4 -> 10; the default here), where the
  target applies;
- slowly changing regression, one point per step into 20 -> 40 -> 1: a ~1 ms step, so it shows Lightning's fixed
  per-step cost (about a dozen hook calls and the optimiser closure) at its largest.

    python benchmarks/loop_overhead.py                                           # PMNIST, 2 tasks of 58,000
    python benchmarks/loop_overhead.py --config configs/bp_scr.yaml --train-size 2000   # SCR, chunk 1
    python benchmarks/loop_overhead.py --small                                   # 2 tasks of 800, once each
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time

import torch

from cl_lightning.cli import main
from cl_lightning.compose import CALLBACK_SLOTS


def _cli(config: str, root: str, tasks: int, train_size: int | None, progress_bar: bool):
    size = [f"--data.stream.init_args.train_size={train_size}"] if train_size else []
    return main(
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
    start = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):  # the bar's output is not what is measured
        cli.trainer.fit(cli.model, cli.datamodule)
    return time.perf_counter() - start, cli.trainer.global_step


def plain_seconds(args: argparse.Namespace, root: str) -> tuple[float, int]:
    """Seconds of the same training in a bare loop (generate the task, then per chunk: predict, score, loss,
    backward, optimiser step) and the steps it took."""
    cli = _cli(args.config, root, args.tasks, args.train_size, False)
    model, stream = cli.model, cli.datamodule.stream
    optimizer = model.configure_optimizers()
    steps = 0
    start = time.perf_counter()
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
    return time.perf_counter() - start, steps


def main_benchmark(argv: list[str] | None = None) -> None:
    """Time both loops (best of ``--repeats``, alternating) and print ms per step and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bp_pmnist.yaml", help="a Backprop config")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=None, help="examples per task (default: the config's)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="2 tasks of 800 examples, one repeat (the smoke test)")
    args = parser.parse_args(argv)
    if args.small:
        args.tasks, args.train_size, args.repeats = 2, 800, 1
    torch.set_num_threads(1)
    best = {"plain": float("inf"), "lightning": float("inf"), "lightning, no bar": float("inf")}
    steps = {}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.repeats):
            runs = {
                "plain": lambda: plain_seconds(args, root),
                "lightning": lambda: lightning_seconds(args, root, True),
                "lightning, no bar": lambda: lightning_seconds(args, root, False),
            }
            for name, run in runs.items():
                seconds, steps[name] = run()
                best[name] = min(best[name], seconds)
    assert len(set(steps.values())) == 1, f"the loops took different numbers of steps: {steps}"
    n = steps["plain"]
    print(f"{args.config}, {args.tasks} tasks, {n} steps")
    for name, seconds in best.items():
        print(f"{name:>18}: {1000 * seconds / n:.3f} ms/step")
    print(
        f"lightning / plain ratio: {best['lightning'] / best['plain']:.3f} "
        f"(no bar: {best['lightning, no bar'] / best['plain']:.3f}; target <= 1.10)"
    )


if __name__ == "__main__":
    main_benchmark()
