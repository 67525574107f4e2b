"""Two-process DDP on CPU (gloo): every chunk is split across the ranks in equal shares, gradients are averaged, the
ranks step together (also while memory fills), and the task means are reduced over the ranks without hanging."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import LEARNERS, bare_trainer, tiny_args
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy

from cl_lightning.contract import StreamBatch
from cl_lightning.data import StreamDataModule, SyntheticClasses
from cl_lightning.data.datamodule import ChunkDataset
from cl_lightning.learners import Backprop
from cl_lightning.learners.engines import StepRun
from cl_lightning.run.cli import main


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


def test_shares_are_equal_when_the_chunk_does_not_divide() -> None:
    stream = SyntheticClasses(num_tasks=1, train_size=70, chunk_size=11)  # 6 chunks of 11 and one of 4
    for world in (2, 3):
        shares = [list(ChunkDataset(stream, 0, rank=r, world_size=world)) for r in range(world)]
        for chunk, parts in enumerate(zip(*shares, strict=True)):
            n = stream.chunk(0, chunk).x.shape[0]
            assert {p.x.shape[0] for p in parts} == {n // world}  # the last n mod W examples are dropped
            taken = torch.cat([p.x for p in parts])
            assert torch.equal(taken.sort(0).values, stream.chunk(0, chunk).x[: n - n % world].sort(0).values)


class _RanksAgree(Callback):
    """After every task: every rank holds the same parameters (averaged gradients, steps taken together) and, for a
    replay learner, a buffer as full as every other rank's (equal shares)."""

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        params = [p.detach().flatten() for p in pl_module.parameters()]
        flat = torch.cat(params) if params else torch.zeros(1)
        gathered = trainer.strategy.all_gather(flat)  # (W, P)
        assert torch.equal(gathered[0], gathered[1]), "ranks' parameters differ"
        if hasattr(pl_module, "buffer"):
            sizes = trainer.strategy.all_gather(pl_module.buffer.n_seen)  # (W,)
            assert int(sizes[0]) == int(sizes[1]) > 0, sizes
        pl_module.log("ddp/tasks_checked", float(trainer.current_epoch + 1), rank_zero_only=True)


def _ddp_trainer(tmp_path: Path, callbacks: list[Callback], tasks: int = 3) -> Trainer:
    # a collective that never completes fails after the timeout instead of hanging the test run
    strategy = DDPStrategy(start_method="spawn", timeout=timedelta(seconds=120))
    return bare_trainer(tmp_path, tasks, devices=2, strategy=strategy, inference_mode=False, callbacks=callbacks)


# MAML with admission draws and one meta-update per admitted example: several backward passes per chunk
MAML_ADMITTED = [a for a in LEARNERS["maml"] if not a.startswith(("--model.admission_prob", "--model.update_on"))]
DDP_LEARNERS = {
    **{k: v for k, v in LEARNERS.items() if k != "knn"},
    "maml_admitted": [*MAML_ADMITTED, "--model.admission_prob=0.5", "--model.start_when_full=false"],
    # the paper configs' batches of chunks (bp/cbp/qoa_pmnist.yaml): a chunk a batch under several processes
    "qoa_steps_per_batch": [*LEARNERS["qoa"], "--model.step_kernel=auto", "--data.steps_per_batch=5"],
}


@pytest.mark.slow
@pytest.mark.parametrize("learner", sorted(DDP_LEARNERS))
def test_every_learner_trains_under_ddp_with_ranks_in_lockstep(tmp_path: Path, learner: str) -> None:
    cli = main(tiny_args(tmp_path, DDP_LEARNERS[learner]), run=False)
    trainer = _ddp_trainer(tmp_path, [_RanksAgree()])
    trainer.fit(cli.model, cli.datamodule)
    metrics = trainer.callback_metrics
    assert trainer.world_size == 2
    assert metrics["ddp/tasks_checked"] == 3  # the ranks agreed after every task (an assertion fails the run)
    assert torch.isfinite(metrics["train/online_acc"])
    assert metrics["eval/forward_acc"] > 0.45  # 4 classes; learned from half of every chunk on each rank
    # every rank evaluated every episode, so rank 0 has the whole accuracy matrix (not only its share of episodes)
    assert {f"eval/acc_matrix/task_{j}" for j in range(3)} <= set(metrics)


class _TaskMeanProbe(Backprop):
    """Logs one name on rank 0 only (as a replay learner whose memory fills later on one rank would) and one
    weighted value per rank whose reduced mean is known."""

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> torch.Tensor:  # the step engine's hook, per chunk
        if self.global_rank == 0:
            self.log_task_mean("probe/rank0_only", torch.tensor(3.0), 2)
        rank = torch.tensor(float(self.global_rank))
        self.log_task_mean("probe/rank", rank, 1 + self.global_rank)  # rank 0 weighs 1, rank 1 weighs 2
        return super().learn_chunk(batch, run)


@pytest.mark.slow
def test_task_means_reduce_over_ranks_when_one_rank_skips_a_name(tmp_path: Path) -> None:
    stream = SyntheticClasses(num_tasks=2, train_size=64, chunk_size=16)
    model = _TaskMeanProbe(input_shape=stream.input_shape, num_outputs=stream.num_outputs, hidden_sizes=[8])
    trainer = _ddp_trainer(tmp_path, [], tasks=2)
    trainer.fit(model, StreamDataModule(stream, context_size=8, eval_queries=8, num_probe_tasks=0))
    metrics = trainer.callback_metrics
    torch.testing.assert_close(metrics["probe/rank0_only"], torch.tensor(3.0))
    torch.testing.assert_close(metrics["probe/rank"], torch.tensor(2.0 / 3.0))  # (0·1·4 + 1·2·4) / (1·4 + 2·4)


def test_a_chunk_smaller_than_the_world_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = SyntheticClasses(num_tasks=1, train_size=8, chunk_size=1)
    dm = StreamDataModule(stream, context_size=4)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, default_root_dir=tmp_path)
    monkeypatch.setattr(Trainer, "world_size", property(lambda self: 2))  # what a two-rank run reports
    dm.trainer = trainer
    with pytest.raises(ValueError, match="chunk_size 1 cannot be split across 2 ranks"):
        dm.setup("fit")


def test_knn_refuses_ddp_with_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's DistributedDataParallel refuses a module without trainable parameters; KNN says so first."""
    cli = main(tiny_args(tmp_path, LEARNERS["knn"]), run=False)
    cli.model.trainer = cli.trainer
    monkeypatch.setattr(Trainer, "world_size", property(lambda self: 2))
    with pytest.raises(ValueError, match="KNN has no parameters to train across devices"):
        cli.model.setup("fit")


@pytest.mark.slow
def test_a_ddp_fit_from_the_command_line_prints_its_summary_once(tmp_path: Path) -> None:
    """``--trainer.strategy=ddp`` launches a second process running the same command: the run's last lines come
    once (rank 0), and no advice to ``sync_dist`` values that are already the same on every rank."""
    args = tiny_args(tmp_path, [*LEARNERS["qoa"], "--data.steps_per_batch=5"], tasks=2)
    args += ["--trainer.devices=2", "--trainer.strategy=ddp"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "cl_lightning", "fit", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("Run finished: 2/2 tasks") == 1, done.stdout
    assert "sync_dist" not in done.stderr


@pytest.mark.slow
def test_a_ddp_fit_on_the_cpu_divides_the_thread_policys_cores_between_its_ranks(tmp_path: Path) -> None:
    """With no thread variable set, a two-process CPU fit runs each rank on half the cores the policy chose (every
    rank on every core would oversubscribe them), and says so once."""
    from cl_lightning.run.threads import THREAD_VARIABLES, WAIT_VARIABLES, usable_cores

    args = tiny_args(tmp_path, [*LEARNERS["backprop"]], tasks=2)
    args += ["--trainer.devices=2", "--trainer.strategy=ddp"]
    env = {k: v for k, v in os.environ.items() if k not in (*THREAD_VARIABLES, *WAIT_VARIABLES)}
    env["PYTHONPATH"] = str(Path(__file__).parents[1])
    done = subprocess.run(
        [sys.executable, "-m", "cl_lightning", "fit", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    chosen = [line for line in done.stderr.splitlines() if line.startswith("Threads: ")]
    assert len(chosen) == 1, done.stderr[-2000:]
    assert chosen[0].startswith(f"Threads: {max(1, usable_cores() // 2)}")


def _ddp_fit(root: Path, tasks: int, extra: list[str] = ()) -> subprocess.Popen:
    """``python -m cl_lightning fit`` of a two-process DDP Backprop run on the synthetic stream, checkpointing every
    task into ``root``'s run folder."""
    args = tiny_args(root, LEARNERS["backprop"], tasks=tasks)
    args += ["--trainer.devices=2", "--trainer.strategy=ddp", "--data.stream.train_size=512"]
    args += ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_last=true"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cl_lightning", "fit", *args, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _ranks_alive(root: Path) -> bool:
    """Whether a process of the fit logging under ``root`` still runs (Linux: its command line in /proc)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if f"--trainer.default_root_dir={root}".encode() in cmdline.read_bytes():
                return True
    return False


def _straight_and_stopped(tmp_path: Path, tasks: int, signum: int) -> tuple[subprocess.Popen, str]:
    """An uninterrupted two-process run of ``tasks`` tasks under ``tmp_path / "straight"``, then one under
    ``tmp_path / "stopped"`` sent ``signum`` once its task 2 is checkpointed: the stopped process and its output."""
    import time

    straight = _ddp_fit(tmp_path / "straight", tasks)
    out, _ = straight.communicate(timeout=600)
    assert straight.returncode == 0, out[-3000:]
    checkpoints = tmp_path / "stopped" / "logs" / "tiny" / "version_0" / "checkpoints"
    stopped = _ddp_fit(tmp_path / "stopped", tasks)
    deadline = time.time() + 300
    while not list(checkpoints.glob("epoch=2*.ckpt")) and time.time() < deadline:
        time.sleep(0.05)
    stopped.send_signal(signum)
    out, _ = stopped.communicate(timeout=300)
    return stopped, out


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "kill-9"])
def test_a_stopped_ddp_run_resumes_as_printed_and_equals_an_uninterrupted_one(tmp_path: Path, signum: int) -> None:
    """#48: a DDP fit keeps one version folder; SIGTERM to rank 0 after a checkpointed task ends the run (143) with a
    resume command that works as printed under the same two processes (rank 1 used to take the run's lock from its
    own rank 0); after kill -9 of rank 0 rank 1 ends too and the same command resumes; either way the resumed run's
    scalars and weights are the uninterrupted run's."""
    import time

    from cl_lightning.study.report import per_task, read_scalars

    tasks = 30
    stopped, out = _straight_and_stopped(tmp_path, tasks, signum)
    run = tmp_path / "stopped" / "logs" / "tiny"
    if signum == signal.SIGTERM:
        assert stopped.returncode == 143, out[-3000:]
        assert "resume with" in out, out[-1500:]
        assert out.rstrip().endswith("--ckpt_path last"), out[-1500:]
    else:  # rank 1 loses its peer and ends (no orphan left holding the run)
        assert stopped.returncode == -signal.SIGKILL
        deadline = time.time() + 120
        while _ranks_alive(tmp_path / "stopped") and time.time() < deadline:
            time.sleep(0.5)
        assert not _ranks_alive(tmp_path / "stopped")
    resumed = _ddp_fit(tmp_path / "stopped", tasks, ["--ckpt_path", "last"])
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out[-3000:]
    assert sorted(p.name for p in run.iterdir()) == ["version_0"]  # no empty folder from rank 1
    a, b = tmp_path / "straight" / "logs" / "tiny" / "version_0", run / "version_0"
    whole, again = per_task(read_scalars(a), tasks), per_task(read_scalars(b), tasks)
    for tag in (t for t in whole if t.startswith(("eval/", "forgetting/"))):
        torch.testing.assert_close(torch.from_numpy(again[tag]), torch.from_numpy(whole[tag]), equal_nan=True, msg=tag)
    weights = [torch.load(d / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for d in (a, b)]
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key


@pytest.mark.slow
def test_a_ddp_checkpoint_resumes_under_one_process(tmp_path: Path) -> None:
    """#48: a checkpoint taken under two processes resumes under one. Under DDP each rank learns its share of every
    chunk and the gradients are averaged, so one process learning the whole chunk takes the same steps up to the
    order of the sums: every task is logged once, the resumed tasks continue the stopped run, and the scores stay
    within rounding of the uninterrupted two-process run's."""

    from cl_lightning.study.report import per_task, read_scalars

    tasks = 8
    stopped, out = _straight_and_stopped(tmp_path, tasks, signal.SIGTERM)
    run = tmp_path / "stopped" / "logs" / "tiny"
    assert stopped.returncode == 143, out[-3000:]
    one = ["--trainer.devices=1", "--trainer.strategy=auto", "--ckpt_path", "last"]
    resumed = _ddp_fit(tmp_path / "stopped", tasks, one)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out[-3000:]
    assert f"Run finished: {tasks}/{tasks} tasks" in out, out[-1500:]
    scalars = read_scalars(run / "version_0")
    assert sorted({int(v) for v in scalars["epoch"].values()}) == list(range(tasks))  # no task skipped
    whole = per_task(read_scalars(tmp_path / "straight" / "logs" / "tiny" / "version_0"), tasks)
    again = per_task(scalars, tasks)
    assert not np.isnan(again["eval/forward_acc"]).any()
    for tag in (t for t in whole if t.startswith(("eval/", "forgetting/"))):
        torch.testing.assert_close(
            torch.from_numpy(again[tag]), torch.from_numpy(whole[tag]), atol=2e-3, rtol=0, equal_nan=True, msg=tag
        )
