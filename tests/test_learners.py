from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import LEARNERS, assert_checkpoint_round_trip, assert_resume_equals_uninterrupted, fit
from torch import nn

from cl_lightning.learners import Backprop, QueryOnlyAttention


class _FixedScores(nn.Module):
    def __init__(self, scores: torch.Tensor) -> None:
        super().__init__()
        self.scores = scores

    def forward(self, query_x: torch.Tensor, support_x: torch.Tensor, support_y: torch.Tensor | None) -> torch.Tensor:
        return self.scores


def test_qoa_class_logit_is_the_sum_of_raw_scores_per_label() -> None:
    model = QueryOnlyAttention(input_shape=(2,), num_outputs=3, memory_size=10, support_size=3)
    model.scorer = _FixedScores(torch.tensor([[1.5, 2.0, -0.5], [0.0, -1.0, 4.0]]))
    support_y = torch.tensor([0, 2, 0])
    logits = model.attend(torch.zeros(2, 2), torch.zeros(3, 2), support_y)
    # query 0: class 0 gets 1.5 + (-0.5) = 1.0, class 1 has no support (0), class 2 gets 2.0; no softmax over S
    torch.testing.assert_close(logits, torch.tensor([[1.0, 0.0, 2.0], [4.0, 0.0, -1.0]]))


def test_qoa_regression_is_a_softmax_over_supports() -> None:
    model = QueryOnlyAttention(input_shape=(2,), num_outputs=1, task_type="regression", memory_size=10, support_size=2)
    assert model.scorer.num_labels == 0
    model.scorer = _FixedScores(torch.tensor([[0.0, math.log(3.0)]]))
    pred = model.attend(torch.zeros(1, 2), torch.zeros(2, 2), torch.tensor([[1.0], [5.0]]))
    torch.testing.assert_close(pred, torch.tensor([[0.25 * 1.0 + 0.75 * 5.0]]))


def test_qoa_predictions_ignore_support_order() -> None:
    torch.manual_seed(0)
    model = QueryOnlyAttention(
        input_shape=(5,), num_outputs=4, memory_size=40, support_size=20, hidden=16, num_hidden_layers=2
    ).double()
    cx, cy, qx = (
        torch.rand(20, 5, dtype=torch.float64),
        torch.randint(0, 4, (20,)),
        torch.rand(6, 5, dtype=torch.float64),
    )
    perm = torch.randperm(20)
    torch.testing.assert_close(model.predict_episode(cx, cy, qx), model.predict_episode(cx[perm], cy[perm], qx))


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="memory_size"):
        QueryOnlyAttention(memory_size=100, support_size=1000)
    with pytest.raises(ValueError, match="support_size"):
        QueryOnlyAttention(memory_size=10, support_size=0)


def test_backprop_ignores_the_context() -> None:
    model = Backprop(input_shape=(8,), num_outputs=4, hidden_sizes=[16])
    qx = torch.rand(5, 8)
    a = model.predict_episode(torch.rand(3, 8), torch.tensor([0, 1, 2]), qx)
    torch.testing.assert_close(a, model(qx))


@pytest.mark.parametrize("learner", ["backprop", "qoa"])
def test_learner_beats_chance_on_a_tiny_stream(tmp_path: Path, learner: str) -> None:
    cli = fit(tmp_path, LEARNERS[learner])
    m = cli.trainer.callback_metrics
    assert torch.isfinite(m["train/loss"])
    assert m["eval/forward_acc"] > 0.25 + 0.2  # 4 classes
    if learner == "qoa":  # Backprop's online accuracy starts each relabelled task on the old labels
        assert m["train/online_acc"] > 0.25 + 0.2
    assert cli.trainer.current_epoch == 3
    assert cli.trainer.max_epochs == 3


def test_qoa_remembers_while_backprop_forgets(tmp_path: Path) -> None:
    bp = fit(tmp_path / "bp", LEARNERS["backprop"], tasks=4).trainer.callback_metrics
    qoa = fit(tmp_path / "qoa", LEARNERS["qoa"], tasks=4).trainer.callback_metrics
    # backward = the task before (lag 1); its input permutation differs, so a memoryless net drops toward chance
    assert qoa["eval/backward_acc"] > qoa["eval/forward_acc"] - 0.1
    assert bp["eval/backward_acc"] < bp["eval/forward_acc"] - 0.2


@pytest.mark.parametrize("learner", ["backprop", "qoa"])
def test_resumed_run_equals_uninterrupted(tmp_path: Path, learner: str) -> None:
    assert_resume_equals_uninterrupted(tmp_path, LEARNERS[learner])


@pytest.mark.parametrize(("learner", "cls"), [("backprop", Backprop), ("qoa", QueryOnlyAttention)])
def test_checkpoint_round_trip_keeps_everything(tmp_path: Path, learner: str, cls: type) -> None:
    assert_checkpoint_round_trip(tmp_path, LEARNERS[learner], cls)
