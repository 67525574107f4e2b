"""Time to write one checkpoint of a paper-size learner: the CLI's atomic writer against Lightning's own.

The CLI writes every checkpoint through :class:`cl_lightning.checkpointing.AtomicCheckpointIO` (temporary file,
fsync, rename). The configs checkpoint at every task's end, and a paper-size task lasts ~1-2.4 s on one GPU, so the
write must stay a small fraction of that. The default learner is QOA V1 of ``qoa_pmnist.yaml`` (a 50,000-image
buffer: ~11 MB of state plus Adam's moments).

    python benchmarks/checkpoint_write.py            # QOA V1, 20 interleaved writes each, medians
    python benchmarks/checkpoint_write.py --small    # a 1,000-example buffer, 3 writes each (the smoke test)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from cl_lightning.checkpointing import AtomicCheckpointIO
from cl_lightning.learners import QueryOnlyAttention


def _median_ms(writers: dict[str, TorchCheckpointIO], checkpoint: dict, folder: Path, repeats: int) -> dict[str, float]:
    """Median milliseconds per write of each writer, interleaved so both see the same disk and page-cache state."""
    times: dict[str, list[float]] = {name: [] for name in writers}
    for _ in range(repeats):
        for name, io in writers.items():
            start = time.perf_counter()
            io.save_checkpoint(checkpoint, folder / f"{name}.ckpt")
            times[name].append(time.perf_counter() - start)
    return {name: sorted(t)[len(t) // 2] * 1e3 for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    """Print the median write time of each writer and the checkpoint's size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="a 1,000-example buffer and 3 writes each")
    args = parser.parse_args(argv)
    if args.small:
        args.repeats = 3
    sizes = {"memory_size": 1_000, "support_size": 100} if args.small else {}
    model = QueryOnlyAttention(**sizes)  # the paper's V1 defaults: FIFO 50,000, scorer 9 x 100
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.rand(2, 49)).sum().backward()  # so Adam has moments to save
    optimizer.step()
    checkpoint = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()], "loops": {}}
    with tempfile.TemporaryDirectory() as folder:
        writers = {"atomic": AtomicCheckpointIO(), "lightning": TorchCheckpointIO()}
        ms = _median_ms(writers, checkpoint, Path(folder), args.repeats)
        size = (Path(folder) / "atomic.ckpt").stat().st_size / 1e6
    print(f"checkpoint {size:.1f} MB; median write: atomic {ms['atomic']:.1f} ms, Lightning {ms['lightning']:.1f} ms")


if __name__ == "__main__":
    main()
