"""The thread policy's training phase: one Lightning callback that runs the training steps on the policy's
``train_threads`` and everything else (evaluation, probes, checkpoints) on its ``threads``, and keeps the training
count in checkpoints, so a resumed run trains on the count it started with whatever the load is then."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from cl_lightning.run.threads import ThreadPolicy


class TrainingThreads(Callback):
    """Set ``torch.set_num_threads(policy.train_threads)`` for each training batch and restore ``policy.threads``
    after it: on a busy machine a training step's small products run faster on one thread, an evaluation's large
    ones on every core (:mod:`cl_lightning.run.threads`). The training count is checkpointed: the thread count
    changes how products sum, so a resumed run keeps it (up to the threads this process has). With ``policy`` None
    (the user's own thread settings) it changes nothing, and a checkpoint of a policy run resumes without a warning."""

    def __init__(self, policy: ThreadPolicy | None) -> None:
        self.policy = policy

    def _set(self, threads: int) -> None:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.policy is not None:
            self._set(self.policy.train_threads)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.policy is not None:
            self._set(self.policy.threads)

    def state_dict(self) -> dict[str, Any]:
        return {} if self.policy is None else {"train_threads": self.policy.train_threads}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Train on the count the checkpointed run trained on (at most this process's threads)."""
        if self.policy is None:
            return
        recorded = int(state_dict.get("train_threads", self.policy.train_threads))
        self.policy = replace(self.policy, train_threads=max(1, min(recorded, self.policy.threads)))
