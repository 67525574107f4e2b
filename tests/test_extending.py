"""A new question without a package edit (#47 item 4): a fast-weight rule, a stream and a learner, each written here,
run through ``python -m cl_lightning fit`` by ``class_path`` (the module is this file, on ``PYTHONPATH``).
``docs/extending.md`` shows the same three. Probes are not yet classes (#47 item 1), so a fourth part waits on that.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT
from torch import Tensor, nn

from cl_lightning.contract import StreamBatch
from cl_lightning.data import TaskData, TaskStream
from cl_lightning.data.stream import task_generator
from cl_lightning.learners import ContinualLearner
from cl_lightning.learners.engines import StepRun
from cl_lightning.nn.fast_weights import Encoded, FastWeightRule
from cl_lightning.study.report import per_task, read_scalars


class DecayingHebbian(FastWeightRule):
    """A rule written outside the package: S_t = λ S_{t−1} + β_t k_t v_tᵀ, read as Sᵀq (a token read before its own
    write when prequential), one token at a time."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay

    def run(self, slow: nn.Module, q: Tensor, enc: Encoded, v: Tensor, s0: tuple[Tensor, ...], prequential: bool):
        s, outputs = s0[0], []
        for t in range(q.shape[2]):
            if prequential:
                outputs.append(q[:, :, t, None] @ s)
            s = self.decay * s + enc.beta[:, :, t, None, None] * enc.keys[:, :, t, :, None] @ v[:, :, t, None]
            if not prequential:
                outputs.append(q[:, :, t, None] @ s)
        return torch.cat(outputs, 2), (s,)


class ShiftedBlobs(TaskStream):
    """A stream written outside the package: Gaussian blobs whose means move by a fresh random shift every task."""

    task_type = "classification"

    def __init__(self, num_tasks: int = 4, num_classes: int = 3, input_dim: int = 6, shift: float = 1.0,
                 train_size: int = 192, query_size: int = 64, chunk_size: int = 16, seed: int = 0) -> None:  # fmt: skip
        super().__init__(num_tasks, train_size, query_size, chunk_size, seed=seed)
        self.num_outputs, self.input_shape, self.shift = num_classes, (input_dim,), shift
        self.means = 3 * torch.randn(num_classes, input_dim, generator=task_generator(seed, 0, salt=5))

    def generate(self, task: int) -> TaskData:
        """Blob samples around the means moved by this task's shift."""
        gen = task_generator(self.seed, task)
        n, k = self.train_size + self.query_size, self.train_size
        y = torch.randint(0, self.num_outputs, (n,), generator=gen)
        shift = self.shift * torch.randn(self.input_shape[0], generator=gen)
        x = self.means[y] + shift + 0.5 * torch.randn(n, self.input_shape[0], generator=gen)
        return TaskData(x[:k], y[:k], x[k:], y[k:])


class NearestMean(ContinualLearner):
    """A learner written outside the package: each class's running mean of the stream (nothing trained by
    gradient); an episode is answered by the nearest class mean of its context."""

    def __init__(self, momentum: float = 0.1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.momentum = momentum
        self.register_buffer("means", torch.zeros(self.num_outputs, *self.input_shape))

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> None:
        """Predict the chunk (online metric), then move each seen class's mean towards the chunk's."""
        x, y, _ = batch
        run.log_online(self.predict_from(self.means, x), y)
        for c in y.unique():
            self.means[c] += self.momentum * (x[y == c].mean(0) - self.means[c])

    def predict_from(self, means: Tensor, x: Tensor) -> Tensor:
        """Logits: minus the squared distance to each class mean."""
        return -(torch.cdist(x.flatten(1), means.flatten(1)) ** 2)

    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """The context's class means (the stream's where a class is missing from it) against the queries."""
        means = self.means.clone()
        for c in context_y.unique():
            means[c] = context_x[context_y == c].mean(0)
        return self.predict_from(means, query_x)

    def output_layer(self) -> None:
        """No trained read-out."""
        return


def _fit(tmp_path: Path, args: list[str]) -> dict[str, Tensor]:
    """``python -m cl_lightning fit`` in a child process with this file importable; the run's per-task scalars."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    base = ["--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", "--trainer.logger.class_path="
            "lightning.pytorch.loggers.TensorBoardLogger", f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.logger.init_args.name=ext", f"--trainer.default_root_dir={tmp_path}",
            "--data.context_size=32", "--data.backward_lag=1"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "cl_lightning", "fit", *base, *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    scalars = read_scalars(tmp_path / "ext" / "version_0")
    return {k: torch.from_numpy(v) for k, v in per_task(scalars, 4).items()}


STREAM = ["--data.stream=test_extending.ShiftedBlobs", "--data.stream.num_tasks=4"]


def test_a_stream_and_a_learner_written_outside_the_package_run_by_class_path(tmp_path: Path) -> None:
    curves = _fit(tmp_path, [*STREAM, "--model=test_extending.NearestMean", "--model.momentum=0.2"])
    forward = curves["eval/forward_acc"]
    assert not forward.isnan().any()
    assert float(forward.mean()) > 1 / 3 + 0.3  # nearest mean of the context beats chance (3 classes) by far
    assert not curves["train/online_acc"].isnan().any()


def test_a_fast_weight_rule_written_outside_the_package_runs_by_class_path(tmp_path: Path) -> None:
    args = [*STREAM, "--model=cl_lightning.learners.ParametricAttention", "--model.rule=test_extending.DecayingHebbian",
            "--model.rule.decay=0.8", "--model.hidden_sizes=[32]", "--model.key_dim=8",
            "--model.optimizer=torch.optim.Adam", "--model.optimizer.lr=0.003"]  # fmt: skip
    curves = _fit(tmp_path, args)
    assert not curves["eval/forward_acc"].isnan().any()
    assert float(curves["eval/forward_acc"][-1]) > 1 / 3 + 0.1


def test_the_outside_rule_is_the_recurrence_it_states() -> None:
    """S after two writes is λ β₁ k₁v₁ᵀ + β₂ k₂v₂ᵀ; a prequential read sees the state before the token's write."""
    rule, h, t = DecayingHebbian(0.5), 1, 2
    k, v = torch.randn(1, h, t, 3), torch.randn(1, h, t, 2)
    beta = torch.tensor([[[1.0, 2.0]]])
    out, (s,) = rule.run(nn.Module(), k, Encoded(k, beta), v, (torch.zeros(1, h, 3, 2),), prequential=True)
    expected = 0.5 * torch.outer(k[0, 0, 0], v[0, 0, 0]) + 2.0 * torch.outer(k[0, 0, 1], v[0, 0, 1])
    torch.testing.assert_close(s[0, 0], expected)
    torch.testing.assert_close(out[0, 0, 1], k[0, 0, 1] @ torch.outer(k[0, 0, 0], v[0, 0, 0]))
    assert torch.equal(out[0, 0, 0], torch.zeros(2))


@pytest.mark.parametrize("name", ["DecayingHebbian", "ShiftedBlobs", "NearestMean"])
def test_nothing_in_the_package_names_the_outside_classes(name: str) -> None:
    assert not [p for p in (ROOT / "cl_lightning").rglob("*.py") if name in p.read_text()]
