"""Two-process DDP on CPU (gloo): every chunk is split across the ranks, gradients are averaged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import LEARNERS, tiny_args

from cl_lightning.cli import main
from cl_lightning.data import StreamDataModule, SyntheticClasses
from cl_lightning.data.datamodule import ChunkDataset


def test_each_rank_takes_its_share_of_every_chunk() -> None:
    stream = SyntheticClasses(num_tasks=2, train_size=64, chunk_size=16)
    full = list(ChunkDataset(stream, 1))
    ranks = [list(ChunkDataset(stream, 1, rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(full) == 4
    for whole, a, b in zip(full, *ranks, strict=True):
        assert a.x.shape[0] == b.x.shape[0] == 8
        assert torch.equal(whole.x[0::2], a.x)
        assert torch.equal(whole.x[1::2], b.x)
    assert StreamDataModule(stream).num_tasks == 2


@pytest.mark.slow
@pytest.mark.parametrize("learner", ["backprop", "qoa"])
def test_ddp_spawn_two_cpu_processes(tmp_path: Path, learner: str) -> None:
    extra = ["--trainer.strategy=ddp_spawn", "--trainer.devices=2", "--trainer.deterministic=false"]
    args = [a for a in tiny_args(tmp_path, LEARNERS[learner]) if not a.startswith("--trainer.devices")]
    cli = main([*args, *extra], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.world_size == 2
    assert metrics["eval/forward_acc"] > 0.45  # 4 classes; learned from half of every chunk on each rank
