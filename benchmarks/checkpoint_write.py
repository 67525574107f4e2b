"""Time to write one checkpoint of a paper-size learner: the CLI's atomic writer against Lightning's own.

The CLI writes every checkpoint through :class:`cl_lightning.run.checkpointing.AtomicCheckpointIO` (temporary file,
fsync, rename). The configs checkpoint at every task's end, and a paper-size task lasts ~1-2.4 s on one GPU, so the
write must stay a small fraction of that. The default learner is QOA V1 of ``qoa_pmnist.yaml`` (a 50,000-image
buffer: ~11 MB of state plus Adam's moments).

    python -m benchmarks.checkpoint_write            # QOA V1, 20 interleaved writes each, medians
    python -m benchmarks.checkpoint_write --small    # a 1,000-example buffer, 3 writes each (the smoke test)
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from benchmarks.harness import Bench, clock, interleave, parser
from cl_lightning.learners import QueryOnlyAttention
from cl_lightning.run.checkpointing import AtomicCheckpointIO


def _write_ms(io: TorchCheckpointIO, checkpoint: dict, path: Path) -> float:
    with clock() as t:
        io.save_checkpoint(checkpoint, path)
    return t.wall * 1e3


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Median write time of each writer (interleaved, so both see the same disk and page-cache state) and the size."""
    bench = Bench.start("checkpoint_write", parser(__doc__, repeats=20), argv)
    args = bench.args
    repeats = 3 if args.small else args.repeats
    sizes = {"memory_size": 1_000, "support_size": 100} if args.small else {}
    model = QueryOnlyAttention(**sizes)  # the paper's V1 defaults: FIFO 50,000, scorer 9 x 100
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.rand(2, 49)).sum().backward()  # so Adam has moments to save
    optimizer.step()
    checkpoint = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()], "loops": {}}
    with tempfile.TemporaryDirectory() as folder:
        writers = {"atomic": AtomicCheckpointIO(), "lightning": TorchCheckpointIO()}
        ms = interleave(
            {
                name: lambda io=io, name=name: _write_ms(io, checkpoint, Path(folder) / f"{name}.ckpt")
                for name, io in writers.items()
            },
            repeats,
        )
        size_mb = (Path(folder) / "atomic.ckpt").stat().st_size / 1e6
    median = {name: statistics.median(v) for name, v in ms.items()}
    rows = [[name, size_mb, median[name], len(ms[name])] for name in writers]
    return bench.finish(
        {"size_mb": size_mb, "median_ms": median, "ms": ms}, ["writer", "checkpoint MB", "median ms", "writes"], rows
    )


if __name__ == "__main__":
    main()
