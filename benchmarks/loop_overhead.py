"""Per-step cost of training through Lightning against a plain PyTorch loop, on a chunk-1 stream.

Slowly changing regression takes one example per step (the paper's protocol), so everything Lightning does around
a step (hooks, logging, the progress bar) is measured against a 20 -> 40 -> 1 network's tiny step. Both loops run
the same Backprop learner and Adam on the same chunks and accumulate the same online MSE; the Lightning run uses
the config's trainer with the progress bar on (as a user sees it) and evaluation, checkpoints and monitors off.

    python benchmarks/loop_overhead.py                  # 2 tasks of 2,000 steps
    python benchmarks/loop_overhead.py --steps 9000     # the paper's task length
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time

import torch

from cl_lightning.cli import main


def _cli(root: str, tasks: int, steps: int, progress_bar: bool):
    return main(
        [
            "--config",
            "configs/bp_scr.yaml",
            f"--data.stream.init_args.num_tasks={tasks}",
            f"--data.stream.init_args.train_size={steps}",
            "--trainer.callbacks=[]",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_model_summary=false",
            f"--trainer.enable_progress_bar={str(progress_bar).lower()}",
            f"--trainer.default_root_dir={root}",
        ],
        run=False,
    )


def lightning_seconds(root: str, tasks: int, steps: int, progress_bar: bool) -> float:
    """Seconds of ``Trainer.fit`` (training only)."""
    cli = _cli(root, tasks, steps, progress_bar)
    cli.datamodule.prepare_data()
    start = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):  # the bar's output is not what is measured
        cli.trainer.fit(cli.model, cli.datamodule)
    return time.perf_counter() - start


def plain_seconds(root: str, tasks: int, steps: int) -> float:
    """Seconds of the same training in a bare loop: predict, score, loss, backward, Adam step."""
    cli = _cli(root, tasks, steps, False)
    model, stream = cli.model, cli.datamodule.stream
    optimizer = model.configure_optimizers()
    start = time.perf_counter()
    for task in range(tasks):
        chunks = [stream.chunk(task, i) for i in range(stream.num_chunks)]  # as the data loader's cache does
        total = torch.zeros((), dtype=torch.float64)
        for x, y, _ in chunks:
            pred = model.predict(x)
            loss = model.loss(pred, y)
            total += model.score(pred.detach(), y).double()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return time.perf_counter() - start


def main_benchmark() -> None:
    """Time both loops (best of ``--repeats``) and print ms per step and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000, help="chunks (examples) per task")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    best = {"plain": float("inf"), "lightning": float("inf"), "lightning, no bar": float("inf")}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.repeats):
            best["plain"] = min(best["plain"], plain_seconds(root, args.tasks, args.steps))
            best["lightning"] = min(best["lightning"], lightning_seconds(root, args.tasks, args.steps, True))
            no_bar = lightning_seconds(root, args.tasks, args.steps, False)
            best["lightning, no bar"] = min(best["lightning, no bar"], no_bar)
    n = args.tasks * args.steps
    for name, seconds in best.items():
        print(f"{name:>18}: {1000 * seconds / n:.3f} ms/step")
    print(
        f"lightning / plain ratio: {best['lightning'] / best['plain']:.2f} (no bar: "
        f"{best['lightning, no bar'] / best['plain']:.2f})"
    )


if __name__ == "__main__":
    main_benchmark()
