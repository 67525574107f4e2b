from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import LEARNERS, assert_checkpoint_round_trip, assert_resume_equals_uninterrupted, fit
from torch import nn

from cl_lightning.contract import ObservedLearner
from cl_lightning.learners import (
    EWC,
    KNN,
    Backprop,
    ContinualBackprop,
    ContinualLearner,
    FullAttention,
    MAMLReplay,
    ParametricAttention,
    QueryOnlyAttention,
)
from cl_lightning.nn.fast_weights import GatedDeltaRule, TTTLinear


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


def _small_learners() -> dict[str, ContinualLearner]:
    torch.manual_seed(0)
    common = {"input_shape": (6,), "num_outputs": 3}
    return {
        "backprop": Backprop(**common, hidden_sizes=[8, 8]),
        "cbp": ContinualBackprop(**common, hidden_sizes=[8, 8]),
        "ewc": EWC(**common, hidden_sizes=[8, 8]),
        "maml": MAMLReplay(**common, hidden_sizes=[8], memory_size=40, num_pseudo_tasks=2, support_size=5),
        "qoa": QueryOnlyAttention(**common, memory_size=20, support_size=5, hidden=8, num_hidden_layers=2),
        "full_attention": FullAttention(**common, memory_size=20, support_size=5, num_layers=2, embed_dim=4),
        "parametric": ParametricAttention(**common, rule=GatedDeltaRule(), hidden_sizes=[8], key_dim=4),
        "knn": KNN(**common, memory_size=20, support_size=5),
    }


def _episode() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.randn(5, 6, generator=gen), torch.tensor([0, 1, 2, 0, 1]), torch.randn(4, 6, generator=gen)


def _calls(model: ContinualLearner, episode: tuple[torch.Tensor, ...]) -> list[tuple[nn.Module, torch.Tensor]]:
    """Every parametrised leaf module run by ``predict_episode``, in call order, with its output."""
    calls: list[tuple[nn.Module, torch.Tensor]] = []
    leaves = [m for m in model.modules() if not list(m.children()) and list(m.parameters(recurse=False))]
    handles = [m.register_forward_hook(lambda m, a, out: calls.append((m, out))) for m in leaves]
    try:
        pred = model.predict_episode(*episode)
    finally:
        for h in handles:
            h.remove()
    calls.append((None, pred))
    return calls


@pytest.mark.parametrize("name", ["backprop", "cbp", "ewc", "maml"])
def test_a_networks_output_layer_computes_its_predictions(name: str) -> None:
    model = _small_learners()[name]
    *_, (last, out), (_, pred) = _calls(model, _episode())
    assert last is model.output_layer()
    assert torch.equal(out, pred)


def test_qoa_output_layer_is_the_scorers_last_layer_whose_scores_make_the_logits() -> None:
    model = _small_learners()["qoa"]
    cx, cy, qx = _episode()
    *_, (last, scores), (_, logits) = _calls(model, (cx, cy, qx))
    assert last is model.output_layer() is model.scorer.out
    torch.testing.assert_close(scores.view(4, 5) @ nn.functional.one_hot(cy, 3).float(), logits)


def test_full_attention_output_layer_is_the_last_layers_value_projection() -> None:
    model = _small_learners()["full_attention"]
    *_, (last, _), (_, pred) = _calls(model, _episode())
    assert last is model.output_layer() is model.transformer.v[-1]
    grads = torch.autograd.grad(pred.sum(), list(model.output_layer().parameters()))
    assert all(bool(g.abs().sum() > 0) for g in grads)


def test_parametric_output_layer_is_the_key_projection_not_the_last_registered_linear() -> None:
    model = _small_learners()["parametric"]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears[-1] is model.gate_proj  # the old guess ("last nn.Linear registered") measured a write gate
    assert model.output_layer() is model.key_proj
    model.fast_state.copy_(torch.randn_like(model.fast_state))
    live = model.predict_episode(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long), _episode()[2])
    heads = [model.key_proj, model.beta_proj, model.gate_proj]
    grads = torch.autograd.grad(live.sum(), [m.weight for m in heads], allow_unused=True)
    read, beta, gate = (None if g is None else float(g.abs().sum()) for g in grads)
    assert read > 0  # the read-out q = l2n(W_k h) feeds the prediction; β and the gate only shape writes
    ttt = ParametricAttention(input_shape=(6,), num_outputs=3, rule=TTTLinear(), hidden_sizes=[8], key_dim=4)
    assert ttt.output_layer() is ttt.value_embed  # TTT's reading is mapped back to values through it
    assert beta in (None, 0.0)
    assert gate in (None, 0.0)


def test_knn_has_no_output_layer_and_the_default_probes_skip_each_output_layer() -> None:
    learners = _small_learners()
    assert learners["knn"].output_layer() is None
    for name, model in learners.items():
        if name != "parametric":  # overrides probe_layers (its encoder MLP)
            assert all(m is not model.output_layer() for m in model.probe_layers().values()), name


def test_continual_learner_is_abstract_and_enforced() -> None:
    with pytest.raises(TypeError, match="abstract"):
        ContinualLearner()

    class _NoReadout(ContinualLearner):
        def training_step(self, batch, batch_idx):
            return None

        def predict_episode(self, context_x, context_y, query_x):
            return query_x

    with pytest.raises(TypeError, match="output_layer"):
        _NoReadout()


def test_every_learner_offers_what_callbacks_call() -> None:
    for name, model in _small_learners().items():
        assert isinstance(model, ObservedLearner), name


@pytest.mark.parametrize("name", ["knn", "qoa", "full_attention", "maml"])
def test_replay_learners_answer_from_the_first_context_examples_or_the_newest_stored(name: str) -> None:
    model = _small_learners()[name].eval()
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(12, 6, generator=gen), torch.randint(0, 3, (12,), generator=gen)
    model.buffer.add(x, y, torch.zeros(12, dtype=torch.long))
    cx, cy, qx = _episode()
    cx, cy = torch.cat([cx, x[:3]]), torch.cat([cy, y[:3]])  # 8 context examples, support_size 5
    n = model.support_size
    torch.testing.assert_close(model.predict_episode(cx, cy, qx), model.predict_support(qx, cx[:n], cy[:n]))
    empty = model.predict_episode(cx[:0], cy[:0], qx)
    torch.testing.assert_close(empty, model.predict_support(qx, x[-n:], y[-n:]))
    torch.testing.assert_close(model(qx), empty)


def test_a_training_step_override_that_calls_super_is_told_to_use_learn_chunk() -> None:
    """Overriding training_step makes a learner step by itself (no engine); delegating to the base: one clear error."""

    class Delegating(Backprop):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx)

    learner = Delegating(input_shape=(4,), num_outputs=2, hidden_sizes=[3])
    assert learner.engine is None
    batch = (torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="put per-chunk work in learn_chunk"):
        learner.training_step(batch, 0)
