"""Shared test helpers: paths and the CLI arguments of tiny fits on the synthetic stream."""

from __future__ import annotations

from pathlib import Path

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
LEARNERS = {"backprop": BACKPROP, "qoa": QOA}
