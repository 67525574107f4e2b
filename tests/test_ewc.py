from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from helpers import EWC as EWC_ARGS
from helpers import assert_checkpoint_round_trip, assert_resume_equals_uninterrupted, fit
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cl_lightning.learners import EWC

pytestmark = pytest.mark.usefixtures("one_thread")


EWC_TINY = EWC_ARGS


def _theta(model: EWC) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_penalty_on_a_hand_worked_case() -> None:
    model = EWC(input_shape=(2,), num_outputs=2, hidden_sizes=[], ewc_lambda=4.0, num_penalties=2)
    with torch.no_grad():
        model.net.layers[0].weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        model.net.layers[0].bias.copy_(torch.tensor([0.0, 1.0]))  # θ = [1, 2, 3, 4, 0, 1]
    assert model.penalty() == 0  # no task consolidated yet: every Fisher is 0
    model.fisher.copy_(torch.tensor([[1.0, 0, 0, 0, 0, 2], [0, 0, 1, 1, 0, 0]]))
    model.anchors.copy_(torch.tensor([[0.0] * 6, [1.0] * 6]))
    # Σ_k Σ_i F (θ − θ*)² = (1·1² + 2·1²) + (1·2² + 1·3²) = 3 + 13 = 16; (λ/2) · 16 = 32
    penalty = model.penalty()
    torch.testing.assert_close(penalty, torch.tensor(32.0))
    penalty.backward()  # λ Σ_k F_k (θ − θ*_k)
    torch.testing.assert_close(model.net.layers[0].weight.grad, torch.tensor([[4.0, 0.0], [8.0, 12.0]]))
    torch.testing.assert_close(model.net.layers[0].bias.grad, torch.tensor([0.0, 8.0]))


def test_fisher_is_the_per_batch_empirical_fisher() -> None:
    torch.manual_seed(0)
    model = EWC(input_shape=(3,), num_outputs=3, hidden_sizes=[4], num_penalties=3).double()
    batches = [(torch.rand(b, 3, dtype=torch.float64), torch.randint(0, 3, (b,))) for b in (5, 5, 2)]
    model.consolidate(batches)
    expected = torch.zeros_like(model.fisher[0])
    for x, y in batches:  # Σ_batches (∂ mean CE / ∂θ)² · |batch| / N, parameter by parameter
        model.zero_grad()
        torch.nn.functional.cross_entropy(model.net(x), y).backward()
        expected += torch.cat([p.grad.flatten() for p in model.parameters()]) ** 2 * x.shape[0] / 12
    torch.testing.assert_close(model.fisher[0], expected)
    assert (model.fisher >= 0).all()
    assert model.fisher[0].gt(0).any()
    assert model.fisher[1:].abs().sum() == 0
    torch.testing.assert_close(model.anchors[0], _theta(model))
    assert int(model.tasks_consolidated) == 1


def test_huge_lambda_pins_the_weights_to_the_anchor() -> None:
    def drift(ewc_lambda: float) -> float:
        torch.manual_seed(0)
        model = EWC(input_shape=(6,), num_outputs=3, hidden_sizes=[16], ewc_lambda=ewc_lambda)
        x_old, x_new = torch.randn(64, 6), torch.randn(64, 6)
        model.consolidate([(x_old, x_old[:, :3].argmax(1))])
        anchor = _theta(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # self.log without a Trainer
            for i in range(50):  # a new task that contradicts the old labels
                optimizer.zero_grad()
                model.training_step((x_new, x_new[:, 3:].argmax(1), None), i).backward()
                optimizer.step()
        moved = (_theta(model) - anchor).abs()
        return moved[model.fisher[0] > 0].max().item()  # weights with F = 0 are not anchored at all

    free, pinned = drift(0.0), drift(1e9)
    assert free > 0.2
    assert pinned < 0.1 * free
    assert pinned < 3 * 0.01  # within a few Adam steps (lr 0.01) of the anchor


def test_ewc_learns_and_penalises_only_after_the_first_task(tmp_path: Path) -> None:
    cli = fit(tmp_path, EWC_TINY)
    m = cli.trainer.callback_metrics
    assert torch.isfinite(m["train/loss"])
    assert m["eval/forward_acc"] > 0.25 + 0.2  # 4 classes
    events = EventAccumulator(str(next((tmp_path / "logs" / "tiny").iterdir())))
    events.Reload()
    penalty = [e.value for e in events.Scalars("train/ewc_penalty")]
    assert penalty[0] == 0  # task 0: nothing consolidated
    assert min(penalty[1:]) > 0
    model = cli.model
    # 3 tasks, K = 2: the ring's slot 0 now holds task 2 (the last), with the final weights as anchor
    assert int(model.tasks_consolidated) == 3
    torch.testing.assert_close(model.anchors[0], _theta(model))
    assert not torch.equal(model.anchors[1], model.anchors[0])
    stream = cli.datamodule.stream
    reference = EWC(input_shape=(8,), num_outputs=4, hidden_sizes=[32, 32], num_penalties=1)
    reference.load_state_dict({k: v for k, v in model.state_dict().items() if k.startswith("net.")}, strict=False)
    reference.consolidate(stream.chunk(2, i)[:2] for i in range(stream.num_chunks))
    torch.testing.assert_close(model.fisher[0], reference.fisher[0])
    assert (model.fisher >= 0).all()


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="num_penalties"):
        EWC(num_penalties=0)


def test_checkpoint_round_trip_keeps_the_fisher_queue(tmp_path: Path) -> None:
    assert_checkpoint_round_trip(tmp_path, EWC_TINY, EWC)
    ckpt = torch.load(next((tmp_path / "ckpt").glob("*.ckpt")), weights_only=False)
    assert {"fisher", "anchors", "tasks_consolidated"} <= ckpt["state_dict"].keys()
    assert ckpt["state_dict"]["fisher"].abs().sum() > 0


def test_resumed_run_equals_uninterrupted(tmp_path: Path) -> None:
    assert_resume_equals_uninterrupted(tmp_path, EWC_TINY)
