"""Shared test helpers: paths and the CLI arguments of tiny fits on the synthetic stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def tiny_args(tmp_path: Path, learner: list[str], tasks: int = 3, extra: list[str] | None = None) -> list[str]:
    """CLI arguments of a tiny CPU fit on the synthetic stream (no progress bar, TensorBoard into tmp_path)."""
    return [
        "--seed_everything=0",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.reload_dataloaders_every_n_epochs=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.deterministic=true",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger",
        f"--trainer.logger.save_dir={tmp_path}/logs",
        "--trainer.logger.name=tiny",
        "--data.stream=cl_lightning.data.SyntheticClasses",
        f"--data.stream.num_tasks={tasks}",
        "--data.context_size=64",
        "--data.backward_lag=1",
        "--data.num_probe_tasks=3",
        *learner,
        *(extra or []),
    ]


def quiet_args(root: Path) -> list[str]:
    """CLI arguments that strip a paper config's fit to the learning: no progress bar, logger, callbacks (the
    configs' named monitors included), checkpoints or model summary; its files under ``root``."""
    from cl_lightning.run.compose import CALLBACK_SLOTS

    return [
        "--trainer.enable_progress_bar=false", "--trainer.logger=false", "--trainer.callbacks=[]",
        *[f"--callbacks.{name}=null" for name in CALLBACK_SLOTS],
        "--trainer.enable_checkpointing=false", "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}",
    ]  # fmt: skip


def bare_trainer(root: Path, tasks: int, **settings: Any):
    """A Trainer of ``tasks`` tasks (one epoch each, loaders rebuilt) without logger, checkpoints, progress bar or
    model summary, on the CPU, its files under ``root``; ``settings`` add to or override these."""
    from lightning.pytorch import Trainer

    settings = {
        "accelerator": "cpu", "max_epochs": tasks, "reload_dataloaders_every_n_epochs": 1, "num_sanity_val_steps": 0,
        "logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
        "default_root_dir": root, **settings,
    }  # fmt: skip
    return Trainer(**settings)


BACKPROP = [
    "--model=cl_lightning.learners.Backprop",
    "--model.hidden_sizes=[32, 32]",
    "--model.optimizer=torch.optim.Adam",
    "--model.optimizer.lr=0.01",
]
QOA = [
    "--model=cl_lightning.learners.QueryOnlyAttention",
    "--model.memory_size=128",
    "--model.support_size=48",
    "--model.sampler=uniform",
    "--model.queries_per_step=16",
    "--model.start_when_full=false",
    "--model.hidden=32",
    "--model.num_hidden_layers=2",
    "--model.optimizer=torch.optim.Adam",
    "--model.optimizer.lr=0.003",
]
KNN = ["--model=cl_lightning.learners.KNN", "--model.memory_size=64", "--model.support_size=64", "--model.k=5"]
FULL_ATTENTION = [
    "--model=cl_lightning.learners.FullAttention",
    "--model.memory_size=64",
    "--model.support_size=48",
    "--model.admit_last=null",
    "--model.queries_per_step=16",
    "--model.num_layers=2",
    "--model.optimizer=torch.optim.Adam",
    "--model.optimizer.lr=0.01",
]
MAML = [
    "--model=cl_lightning.learners.MAMLReplay",
    "--model.hidden_sizes=[32]",
    "--model.memory_size=64",
    "--model.num_pseudo_tasks=2",
    "--model.support_size=8",
    "--model.query_size=8",
    "--model.inner_steps=2",
    "--model.inner_lr=0.5",
    "--model.admission_prob=1.0",
    "--model.update_on=chunk",
    "--model.optimizer=torch.optim.Adam",
    "--model.optimizer.lr=0.003",
    "--trainer.inference_mode=false",
    "--data.stream.chunk_size=32",
]
EWC = [
    "--model=cl_lightning.learners.EWC",
    "--model.hidden_sizes=[32, 32]",
    "--model.ewc_lambda=100.0",
    "--model.num_penalties=2",
    "--model.optimizer=torch.optim.Adam",
    "--model.optimizer.lr=0.01",
]
CBP = [
    "--model=cl_lightning.learners.ContinualBackprop",
    "--model.hidden_sizes=[32, 32]",
    "--model.replacement_rate=0.05",
    "--model.maturity_threshold=5",
    "--model.optimizer=cl_lightning.nn.AdamGnT",
    "--model.optimizer.lr=0.01",
]
PARAMETRIC = [
    "--model=cl_lightning.learners.ParametricAttention",
    "--model.rule=GatedDeltaRule",
    "--model.hidden_sizes=[32]",
    "--model.key_dim=16",
    "--model.optimizer=torch.optim.Adam",
    "--model.optimizer.lr=0.003",
]
LEARNERS = {
    "backprop": BACKPROP,
    "qoa": QOA,
    "knn": KNN,
    "full_attention": FULL_ATTENTION,
    "maml": MAML,
    "ewc": EWC,
    "cbp": CBP,
    "parametric": PARAMETRIC,
}


def fit(tmp_path: Path, learner: list[str], tasks: int = 3, extra: list[str] | None = None):
    """Build a tiny run through the real CLI (no subprocess) and fit it; returns the LightningCLI object."""
    from cl_lightning.run.cli import main

    cli = main(tiny_args(tmp_path, learner, tasks, extra), run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    return cli


def assert_resume_equals_uninterrupted(tmp_path: Path, learner: list[str]) -> None:
    """Learner contract: 3 tasks straight == 1 task, checkpoint, resume to 3 tasks (state and logged metrics)."""
    import torch

    keep_all = [
        "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.save_top_k=-1",
        "--trainer.callbacks.every_n_epochs=1",
        f"--trainer.callbacks.dirpath={tmp_path}/ckpt",
        "--trainer.callbacks.filename=task{epoch}",
    ]
    straight = fit(tmp_path / "a", learner, extra=keep_all)
    after_task_1 = tmp_path / "ckpt" / "taskepoch=0.ckpt"
    assert after_task_1.exists(), sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    from cl_lightning.run.cli import main

    resumed = main(tiny_args(tmp_path / "b", learner), run=False)
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path=str(after_task_1))
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for name, value in straight.trainer.callback_metrics.items():
        if name.startswith(("eval/", "train/")):
            assert torch.equal(value, resumed.trainer.callback_metrics[name]), name


def assert_checkpoint_round_trip(tmp_path: Path, learner: list[str], cls: type, input_dim: int = 8) -> None:
    """Learner contract: load_from_checkpoint restores every tensor and the same predictions."""
    import torch

    cli = fit(
        tmp_path,
        learner,
        extra=[
            "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
            f"--trainer.callbacks.dirpath={tmp_path}/ckpt",
        ],
    )
    path = next((tmp_path / "ckpt").glob("*.ckpt"))
    loaded = cls.load_from_checkpoint(path)
    state = loaded.state_dict()
    for k, v in cli.model.state_dict().items():
        assert torch.equal(v, state[k]), k
    x = torch.rand(4, input_dim)
    cli.model.eval()
    loaded.eval()
    torch.testing.assert_close(cli.model(x), loaded(x))
