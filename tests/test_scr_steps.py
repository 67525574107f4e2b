"""Chunked stepping (``data.steps_per_batch``): K one-point steps inside one training batch are the paper's
algorithm: the same per-point predictions, losses and weights as one point per batch, and a resumed run equals an
uninterrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CONFIGS, quiet_args
from torch import Tensor

from cl_lightning.contract import StreamSteps
from cl_lightning.data import SlowlyChangingRegression, StreamDataModule
from cl_lightning.data.datamodule import ChunkDataset
from cl_lightning.learners import Backprop
from cl_lightning.learners.engines import StepRun, check_steps

STEPPED = ["bp_scr", "qoa_scr", "cbp_scr", "knn_scr", "full_attention_scr", "maml_replay_scr"]
SLOW = pytest.mark.slow  # 20-60 s on a loaded 2-core machine


def _marked(configs: list[str], slow: set[str]) -> list[Any]:
    return [pytest.param(c, marks=SLOW) if c in slow else c for c in configs]


SMALLER = {  # MAML's paper buffer would not fill in these short tasks: small pseudo-tasks, frequent updates
    "maml_replay_scr": [
        "--model.init_args.num_pseudo_tasks=2", "--model.init_args.support_size=10",
        "--model.init_args.query_size=5", "--model.init_args.update_prob=0.2", "--model.init_args.memory_size=60",
    ],
}  # fmt: skip
KERNELS = {"bp_scr", "qoa_scr", "cbp_scr"}  # the learners with a step_kernel (their configs: fused)
CHUNKED = ["delta_rule_scr", "gated_delta_rule_scr"]  # chunks of 64 through a parallel form: one per batch


pytestmark = pytest.mark.usefixtures("one_thread")


def _args(config: str, root: Path, steps: int, tasks: int = 3, extra: list[str] | None = None) -> list[str]:
    return [
        "--config", str(CONFIGS / f"{config}.yaml"),
        f"--data.stream.init_args.num_tasks={tasks}", "--data.stream.init_args.train_size=300",
        "--data.stream.init_args.query_size=100", "--data.num_probe_tasks=2", f"--data.steps_per_batch={steps}",
        *quiet_args(root), *SMALLER.get(config, []), *(extra or []),
    ]  # fmt: skip


def _checkpoint_each_task(root: Path) -> list[str]:
    """Arguments saving a checkpoint after every task, ``root/ckpt/taskepoch=<t>.ckpt``."""
    return [
        "--trainer.enable_checkpointing=true",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.every_n_epochs=1",
        f"--trainer.callbacks.dirpath={root}/ckpt", "--trainer.callbacks.filename=task{epoch}",
    ]  # fmt: skip


def _recorded_fit(config: str, root: Path, steps: int) -> tuple[Any, dict[str, list[Tensor]]]:
    """Fit through the CLI, recording every online prediction and every task-mean term (training losses) the
    learner logs, in order (the step run's methods, called through). The autograd engine, chunk by chunk: the fused
    engine, which logs once per batch, is compared with it in ``tests/test_fused_steps.py``."""
    from cl_lightning.run.cli import main

    kernel = ["--model.init_args.step_kernel=autograd"] if config in KERNELS else []
    cli = main(_args(config, root, steps, extra=kernel), run=False)
    seen = {"online": [], "loss": []}
    online_fn, mean_fn = StepRun.log_online, StepRun.log_task_mean

    def log_online(run: StepRun, pred: Tensor, y: Tensor, value: Tensor | None = None) -> None:
        seen["online"].append(pred.detach().clone())
        online_fn(run, pred, y, value)

    def log_task_mean(run: StepRun, name: str, value: Tensor, weight: int = 1) -> None:
        if name == "train/loss":
            seen["loss"].append(value.detach().clone())
        mean_fn(run, name, value, weight)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StepRun, "log_online", log_online)
        patch.setattr(StepRun, "log_task_mean", log_task_mean)
        cli.trainer.fit(cli.model, cli.datamodule)
    return cli, seen


@pytest.mark.parametrize("config", _marked(STEPPED, {"full_attention_scr", "maml_replay_scr"}))
def test_steps_in_one_batch_equal_one_point_per_batch(config: str, tmp_path: Path) -> None:
    one, one_seen = _recorded_fit(config, tmp_path / "one", 1)
    many, many_seen = _recorded_fit(config, tmp_path / "many", 64)  # 300 points: 4 batches of 64 and one of 44
    assert isinstance(next(iter(many.datamodule.train_dataloader())), StreamSteps)
    assert len(one_seen["loss"]) == len(many_seen["loss"])
    assert (len(one_seen["loss"]) > 10) == (config != "knn_scr")  # kNN only stores
    assert len(one_seen["online"]) == len(many_seen["online"]) > 500
    for key in ("loss", "online") if one_seen["loss"] else ("online",):
        flat = [torch.cat([t.reshape(-1) for t in seen[key]]) for seen in (many_seen, one_seen)]
        torch.testing.assert_close(*flat, rtol=0, atol=0, msg=key)
    a, b = one.model.state_dict(), many.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert one.trainer.global_step == many.trainer.global_step > 0  # optimiser steps (kNN: chunks, as Lightning)
    for name, value in one.trainer.callback_metrics.items():  # task means: float64 sums in another order
        torch.testing.assert_close(many.trainer.callback_metrics[name], value, msg=name)


def _logged(root: Path, steps: int, kernel: str) -> dict[str, dict[int, float]]:
    """Every scalar a 3-task Backprop run logs to TensorBoard, by tag and step."""
    from cl_lightning.run.cli import main
    from cl_lightning.study.report import read_scalars

    logger = [
        "--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger", f"--trainer.logger.init_args.save_dir={root}",
        f"--model.init_args.step_kernel={kernel}",
    ]  # fmt: skip
    main(["fit", *_args("bp_scr", root, steps, extra=logger)])
    return read_scalars(next(root.rglob("events.out.tfevents.*")).parent)


@pytest.mark.parametrize("kernel", ["autograd", "fused"])
def test_a_stepped_run_logs_every_value_at_the_steps_of_one_chunk_a_batch(kernel: str, tmp_path: Path) -> None:
    """The logging step counts chunks, not batches: TensorBoard's axis does not depend on ``steps_per_batch``."""
    one, many = _logged(tmp_path / "one", 1, kernel), _logged(tmp_path / "many", 64, kernel)
    assert one.keys() == many.keys()
    assert {"eval/forward_mse", "train/online_mse", "epoch"} <= one.keys()
    for tag in one:
        assert one[tag].keys() == many[tag].keys(), tag
        assert max(one[tag]) > 250 or tag == "hp_metric", tag  # 300 points a task: steps count points
        for step, value in one[tag].items():
            assert many[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-9), (tag, step)


@pytest.mark.parametrize("config", _marked(STEPPED, set(STEPPED) - {"bp_scr", "qoa_scr"}))
def test_a_resumed_stepped_run_equals_an_uninterrupted_one(config: str, tmp_path: Path) -> None:
    from cl_lightning.run.cli import main

    straight = main(_args(config, tmp_path / "a", 64, extra=_checkpoint_each_task(tmp_path)), run=False)
    straight.trainer.fit(straight.model, straight.datamodule)
    resumed = main(_args(config, tmp_path / "b", 64), run=False)
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path=str(tmp_path / "ckpt" / "taskepoch=1.ckpt"))
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert straight.trainer.global_step == resumed.trainer.global_step
    for name, value in straight.trainer.callback_metrics.items():
        assert torch.equal(value, resumed.trainer.callback_metrics[name]), name


@pytest.mark.parametrize("config", CHUNKED)
def test_learners_without_chunked_steps_refuse_them(config: str, tmp_path: Path) -> None:
    from cl_lightning.run.cli import main

    cli = main(_args(config, tmp_path, 64, tasks=1, extra=["--data.stream.init_args.chunk_size=1"]), run=False)
    assert not type(cli.model).learns_steps()
    with pytest.raises(TypeError, match="steps_per_batch: 1"):
        cli.trainer.fit(cli.model, cli.datamodule)


def test_steps_batches_hold_the_chunks_in_arrival_order() -> None:
    stream = SlowlyChangingRegression(num_tasks=2, train_size=300, query_size=100, warmup_tasks=1)
    for task in (0, 1):  # a warm-up task streams its 400 points
        chunks = list(ChunkDataset(stream, task))
        steps = list(ChunkDataset(stream, task, steps=64))
        assert [s.x.shape[0] for s in steps][:-1] == [64] * (len(steps) - 1)
        for field in range(3):
            assert torch.equal(torch.cat([s[field] for s in steps]), torch.stack([c[field] for c in chunks]))


def test_steps_per_batch_is_checked() -> None:
    with pytest.raises(ValueError, match="steps_per_batch"):
        StreamDataModule(SlowlyChangingRegression(num_tasks=2, train_size=300, query_size=100), steps_per_batch=0)
    dm = StreamDataModule(SlowlyChangingRegression(num_tasks=2, train_size=300, chunk_size=7), steps_per_batch=4)
    learner = Backprop(input_shape=(20,), num_outputs=1, task_type="regression", hidden_sizes=[4])
    with pytest.raises(ValueError, match="divide"):
        check_steps(learner, dm, 1)
    check_steps(learner, dm, 2)  # several processes: a chunk a batch, so the chunks need not divide a task
    assert (dm.chunks_per_batch(1), dm.chunks_per_batch(2)) == (4, 1)


def test_qoa_online_prediction_reused_from_training_is_the_memory_prediction(tmp_path: Path) -> None:
    """Sliding sampler, one point: the training prediction logged as the online one equals predicting the point
    from the ``support_size`` stored before it with the same weights (what ``log_online_from_memory`` computes)."""
    from cl_lightning.run.cli import main

    cli = main(_args("qoa_scr", tmp_path, 1, tasks=1, extra=["--model.init_args.step_kernel=autograd"]), run=False)
    model, online_fn, checked = cli.model, StepRun.log_online, []

    def log_online(run: StepRun, pred: Tensor, y: Tensor, value: Tensor | None = None) -> None:
        if len(model.buffer) == model.buffer.capacity and model.buffer.n_seen > model.buffer.capacity:
            idx = model.buffer.newest(model.support_size + 1)  # the point just stored, after its supports
            with torch.no_grad():
                ref = model.predict_support(model.buffer.get(idx[-1:])[0], *model.buffer.get(idx[:-1]))
            torch.testing.assert_close(pred, ref)
            checked.append(pred.requires_grad)
        online_fn(run, pred, y, value)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StepRun, "log_online", log_online)
        cli.trainer.fit(model, cli.datamodule)
    assert len(checked) == 300 - 101  # every step after the buffer filled reused its training prediction


def test_only_learners_whose_own_chunk_step_is_their_training_step_take_steps() -> None:
    from cl_lightning import learners

    takes = {name for name in learners.__all__ if getattr(learners, name).learns_steps()}
    # EWC inherits Backprop's chunk step but adds its penalty in its own training_step: refused, not silently wrong
    assert takes == {"Backprop", "ContinualBackprop", "QueryOnlyAttention", "KNN", "FullAttention", "MAMLReplay"}
