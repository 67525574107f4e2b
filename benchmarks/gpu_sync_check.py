"""Count the host-device synchronisations of steady training steps of a config (default: QOA V1 at paper size).

On CUDA: ``torch.cuda.set_sync_debug_mode("warn")`` is switched on for the training steps after ``--warmup`` steps of
the second task (the buffer is full, the learner trains every chunk) and off for evaluation and each task's end;
every synchronising CUDA call then warns, and the warnings are counted by where they came from. On the CPU
(``--device cpu``, the test mode) there is nothing to synchronise with, so the same steps run under the
taint-tracking recorder of ``benchmarks/sync_check.py``, which reports the operations that would synchronise.

Expected: none per step. ``DivergenceStop`` reads its device flag once per 100 steps, by design.

    python -m benchmarks.gpu_sync_check                          # CUDA, bf16-mixed, QOA V1 at paper size, 2 tasks
    python -m benchmarks.gpu_sync_check --device cpu --small     # the CPU test mode
"""

from __future__ import annotations

import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from benchmarks.harness import Bench, parser
from benchmarks.paper_size import SMALL
from benchmarks.sync_check import PER_STEP_ON_CPU_ONLY, PER_TASK, SyncWatch
from cl_lightning.run.cli import main as cli_main


class CudaSyncWatch(Callback):
    """Switch CUDA's sync debug mode to "warn" for the watched steps (second task on, after ``warmup`` steps)."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.steps, self._seen = warmup, 0, 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Watch this step if it is a steady one."""
        self._seen += 1
        watch = trainer.current_epoch >= 1 and batch_idx >= self.warmup
        self.steps += watch
        torch.cuda.set_sync_debug_mode("warn" if watch else 0)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Evaluation is not watched."""
        torch.cuda.set_sync_debug_mode(0)

    on_train_epoch_end = on_validation_start  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the check; the result holds ``steps`` (watched) and ``events`` (where -> count)."""
    p = parser(__doc__, threads=0)
    p.add_argument("--config", default="configs/qoa_pmnist.yaml")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--warmup", type=int, default=10, help="steps of the second task before watching")
    p.add_argument("--set", nargs="*", default=[], help="CLI overrides without the leading --")
    bench = Bench.start("gpu_sync_check", p, argv)
    args = bench.args
    cuda = args.device.startswith("cuda")
    cli_args = [
        f"--config={args.config}",
        *([*SMALL, "--data.stream.init_args.chunk_size=50"] if args.small else []),
        "--data.stream.init_args.num_tasks=2",
        "--data.backward_lag=1",
        "--data.num_probe_tasks=1",
        "--data.steps_per_batch=1",  # one chunk a batch: each watched batch is one training step
        "--callbacks.checkpoint=null",
        f"--trainer.accelerator={'gpu' if cuda else 'cpu'}",
        f"--trainer.precision={args.precision}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *[f"--{kv}" for kv in args.set],
    ]
    with tempfile.TemporaryDirectory() as root:
        cli = cli_main([*cli_args, f"--trainer.logger.init_args.save_dir={root}"], run=False)
        if cuda:
            watch: Any = CudaSyncWatch(args.warmup)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cli.trainer.callbacks.insert(0, watch)
                cli.trainer.fit(cli.model, cli.datamodule)
            torch.cuda.set_sync_debug_mode(0)
            events = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchronizing" in str(w.message))
            steps, known = watch.steps, {}
        else:
            # the first task's chunks fill the buffer; the watch starts after them and the warm-up
            watch = SyncWatch(cli.datamodule.stream.num_chunks + args.warmup)
            cli.trainer.callbacks.insert(0, watch)
            cli.trainer.fit(cli.model, cli.datamodule)
            reasons = {**PER_STEP_ON_CPU_ONLY, **PER_TASK}
            events = Counter(f"{e.what} at {e.where}" for e in watch.rec.events if e.where not in reasons)
            seen = Counter(e.where for e in watch.rec.events if e.where in reasons)
            known = {where: (n, reasons[where]) for where, n in seen.items()}
            steps = watch.steps
    total = sum(events.values())
    notes = [
        f"sync check ({args.device}, {args.precision}, {args.config}): {steps} steady training steps watched",
        f"synchronisations: {total} ({total / max(steps, 1):.2f} per step)",
        *(f"not counted: {n} at {where} ({why})" for where, (n, why) in known.items()),
    ]
    rows = [[n, where] for where, n in events.most_common(10)]
    return bench.finish({"steps": steps, "events": dict(events)}, ["synchronisations", "where"], rows, notes)


if __name__ == "__main__":
    main()
