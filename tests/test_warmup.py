"""Warm-up tasks (the paper's ``past_task_offset`` = 5): the first tasks train on all their data and are never
evaluated; evaluation numbers the evaluated tasks from 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import BACKPROP, KNN, assert_resume_equals_uninterrupted, fit

from cl_lightning.callbacks import ForgettingMonitor
from cl_lightning.contract import EvalSlot
from cl_lightning.data import PermutedMNIST, SlowlyChangingRegression, SyntheticClasses
from cl_lightning.data.datamodule import ChunkDataset, StreamDataModule
from cl_lightning.study.report import per_task, read_scalars


def test_a_scr_warmup_task_trains_on_all_10000_points_in_arrival_order() -> None:
    warm = SlowlyChangingRegression(num_tasks=3, warmup_tasks=1, seed=4)
    plain = SlowlyChangingRegression(num_tasks=3, seed=4)
    chunks = list(ChunkDataset(warm, 0))
    assert len(chunks) == 10_000
    assert all(c.x.shape == (1, 20) for c in chunks)
    x, y = torch.cat([c.x for c in chunks]), torch.cat([c.y for c in chunks])
    task = plain.task(0)  # the same 10,000 steps: the 9,000 training ones, then the 1,000 held out
    assert torch.equal(x, torch.cat([task.train_x, task.query_x]))
    assert torch.equal(y, torch.cat([task.train_y, task.query_y]))
    assert torch.equal(y, plain.target(x))
    assert bool((x[:, :15] == plain.slow_bits(0)).all())  # one task's slow bits throughout
    # the next task is evaluated: its 9,000 training points only, its queries held out, the same as without warm-up
    assert len(ChunkDataset(warm, 1)) == 9_000
    assert warm.task_train_size(1) == 9_000
    assert all(torch.equal(a, b) for a, b in zip(warm.episode(1, 100), plain.episode(1, 100), strict=True))


def test_a_pmnist_warmup_task_trains_on_all_60000_images_in_150_chunks_of_400() -> None:
    stream = PermutedMNIST(num_tasks=2, warmup_tasks=1, seed=1)
    assert (stream.task_num_chunks(0), stream.task_num_chunks(1)) == (150, 145)
    train, query = stream.split_indices(0)
    images = stream.task(0).train_x
    assert images.shape == (60_000, 49)
    assert torch.cat([train, query]).unique().numel() == 60_000  # every MNIST training image once
    assert torch.equal(stream.task(0).train_y, torch.cat([stream.generate(0).train_y, stream.generate(0).query_y]))


def test_the_data_module_numbers_evaluated_tasks_from_zero() -> None:
    stream = SyntheticClasses(num_tasks=7, warmup_tasks=3)
    dm = StreamDataModule(stream, context_size=16, backward_lag=[1, 2], num_probe_tasks=3)
    assert (dm.num_tasks, dm.warmup_tasks, dm.num_evaluated_tasks) == (7, 3, 4)
    assert dm.probe_tasks == [0, 2, 3]  # evenly over the 4 evaluated tasks
    assert [dm.eval_items(epoch) for epoch in range(3)] == [[], [], []]  # warm-up epochs evaluate nothing
    assert [dm.evaluated_task(epoch) for epoch in (2, 3, 6)] == [None, 0, 3]
    assert dict(dm.eval_items(4)) == {1: [EvalSlot("forward")], 0: [EvalSlot("backward")]}  # lag 2: a warm-up task
    after_probe = dict(dm.eval_items(5))  # evaluated task 2, a probe task: its row of R
    assert after_probe[2] == [EvalSlot("forward"), EvalSlot("matrix", 2)]
    assert after_probe[0] == [EvalSlot("backward"), EvalSlot("matrix", 0)]
    assert 1 in after_probe
    episode, plain = dm.episode(1), stream.episode(4, 16)
    assert all(torch.equal(a, b) for a, b in zip(episode, plain, strict=True))
    batches = list(dm.task_batches(0))  # epoch 0's training data: the warm-up task's whole data
    assert sum(b.x.shape[0] for b in batches) == 256 + 64
    with pytest.raises(IndexError, match=r"evaluated task 4 outside 0\.\.3"):
        dm.episode(4)


@pytest.mark.parametrize("warmup", [-1, 3, 5])
def test_warmup_outside_the_stream_raises(warmup: int) -> None:
    with pytest.raises(ValueError, match=f"warmup_tasks must be in 0..num_tasks - 1 = 2 .*got {warmup}"):
        SyntheticClasses(num_tasks=3, warmup_tasks=warmup)


def _forgetting(cli) -> ForgettingMonitor:
    return next(c for c in cli.trainer.callbacks if isinstance(c, ForgettingMonitor))


MONITORS = [
    "--trainer.callbacks+=cl_lightning.callbacks.ForgettingMonitor",
    "--trainer.callbacks+=cl_lightning.callbacks.PlasticityMonitor",
    "--trainer.callbacks.probe_size=32",
]
HARD = ["--data.stream.noise=2.0"]  # blobs that overlap: kNN is not at 1.0


def test_evaluated_tasks_equal_a_run_without_warmup_where_training_does_not_matter(tmp_path: Path) -> None:
    """kNN answers from the episode's context alone: after 2 warm-up tasks its R, forward and backward curves are
    the plain run's from stream task 2 on (backward of evaluated task 0 would read a warm-up task: not logged)."""
    warm = fit(tmp_path / "w", [*KNN, *HARD, "--data.stream.warmup_tasks=2", "--data.num_probe_tasks=3"], 5, MONITORS)
    plain = fit(tmp_path / "n", [*KNN, *HARD, "--data.num_probe_tasks=5"], 5, MONITORS)
    w, n = _forgetting(warm), _forgetting(plain)
    assert w.probe_tasks == [0, 1, 2]
    assert w.matrix.shape == (3, 3)
    assert w.forward.shape == (3,)
    assert 0.3 < float(w.matrix.diagonal().mean()) < 0.95  # neither chance (0.25) nor perfect
    torch.testing.assert_close(w.matrix, n.matrix[2:, 2:], rtol=0, atol=0)
    torch.testing.assert_close(w.forward, n.forward[2:], rtol=0, atol=0)
    assert torch.isnan(w.backward[0])
    assert not torch.isnan(n.backward[2])
    torch.testing.assert_close(w.backward[1:], n.backward[3:], rtol=0, atol=0)


def test_warmup_tasks_train_but_leave_no_trace_in_evaluation_or_monitors(tmp_path: Path) -> None:
    """Backprop, 2 warm-up + 2 evaluated tasks: training logs at all 4 epochs, evaluation and the plasticity probe
    only at epochs 2 and 3 (the report's tasks 0 and 1)."""
    warm = fit(tmp_path / "w", [*BACKPROP, "--data.stream.warmup_tasks=2"], 4, MONITORS)
    plain = fit(tmp_path / "n", BACKPROP, 4, MONITORS)
    scalars = read_scalars(Path(warm.trainer.log_dir))
    epoch_at = scalars["epoch"]
    epochs_of = {tag: sorted({int(epoch_at[s]) for s in scalars[tag] if s in epoch_at}) for tag in scalars}
    assert epochs_of["train/online_acc"] == [0, 1, 2, 3]
    for tag in ("eval/forward_acc", "eval/acc_matrix/task_0", "plasticity/weight_magnitude"):
        assert epochs_of[tag] == [2, 3], tag
    assert "eval/acc_matrix/task_2" not in scalars  # two evaluated tasks, two probe tasks
    assert _forgetting(warm).matrix.shape == (2, 2)
    tasks = per_task(scalars, 2, warmup_tasks=2)
    np.testing.assert_allclose(tasks["eval/forward_acc"], _forgetting(warm).forward.numpy(), rtol=1e-6)
    # a warm-up task steps on its 256 training and 64 held-out examples: 20 chunks of 16 instead of 16
    assert (warm.trainer.global_step, plain.trainer.global_step) == (2 * 20 + 2 * 16, 4 * 16)


def test_resume_mid_warmup_equals_uninterrupted(tmp_path: Path) -> None:
    """Checkpoint after epoch 0 of 2 warm-up tasks, resume to the end: same weights and logged metrics."""
    assert_resume_equals_uninterrupted(tmp_path, [*BACKPROP, "--data.stream.warmup_tasks=2", *MONITORS[:1]])
