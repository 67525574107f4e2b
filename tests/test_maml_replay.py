from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import MAML, assert_checkpoint_round_trip, assert_resume_equals_uninterrupted, fit
from torch import nn

from cl_lightning.learners import MAMLReplay
from cl_lightning.memory.support_sampler import pseudo_task_sample

TINY = MAML


TINY_MODEL = {  # 3 inputs, 2 classes, an MLP of width 4, a 40-example buffer of 2 pseudo-tasks of 5 + 4
    "input_shape": (3,),
    "num_outputs": 2,
    "hidden_sizes": [4],
    "memory_size": 40,
    "num_pseudo_tasks": 2,
    "support_size": 5,
    "query_size": 4,
}


def _tiny_model(inner_steps: int = 2, first_order: bool = False) -> MAMLReplay:
    torch.manual_seed(0)
    return MAMLReplay(**TINY_MODEL, inner_steps=inner_steps, inner_lr=0.1, first_order=first_order).double()


def _hand_unrolled(model: MAMLReplay, sx, sy, qx, qy, first_order: bool):
    """Two SGD steps per pseudo-task with torch.autograd, the outer gradient of the mean query loss."""
    lin1, lin2 = model.net[1].layers
    theta = [lin1.weight, lin1.bias, lin2.weight, lin2.bias]

    def f(p, x):
        return nn.functional.linear(nn.functional.linear(x, p[0], p[1]).relu(), p[2], p[3])

    losses = []
    for t in range(sx.shape[0]):
        p = list(theta)
        for _ in range(2):
            g = torch.autograd.grad(nn.functional.cross_entropy(f(p, sx[t]), sy[t]), p, create_graph=not first_order)
            p = [w - 0.1 * gw for w, gw in zip(p, g, strict=True)]
        losses.append(nn.functional.cross_entropy(f(p, qx[t]), qy[t]))
    loss = torch.stack(losses).mean()
    return loss, torch.autograd.grad(loss, theta)


@pytest.mark.parametrize("first_order", [False, True])
def test_inner_loop_equals_a_hand_unrolled_two_step_update(first_order: bool) -> None:
    model = _tiny_model(first_order=first_order)
    gen = torch.Generator().manual_seed(1)
    sx, qx = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64), torch.randn(2, 4, 3, generator=gen).double()
    sy, qy = torch.randint(0, 2, (2, 5), generator=gen), torch.randint(0, 2, (2, 4), generator=gen)
    loss = model.meta_loss(sx, sy, qx, qy)
    grads = torch.autograd.grad(loss, list(model.net.parameters()))
    ref_loss, ref_grads = _hand_unrolled(model, sx, sy, qx, qy, first_order)
    torch.testing.assert_close(loss, ref_loss)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b)
    if not first_order:  # the second-order terms are really there
        _fo_loss, fo_grads = _hand_unrolled(model, sx, sy, qx, qy, first_order=True)
        assert max((a - b).abs().max() for a, b in zip(grads, fo_grads, strict=True)) > 1e-6


def test_adaptation_lowers_support_loss_and_leaves_theta_untouched() -> None:
    model = _tiny_model(inner_steps=5)
    before = [p.clone() for p in model.parameters()]
    with torch.inference_mode():  # as in Lightning's default validation, inputs made there too
        x, y = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
        start = model.loss(model.net(x), y)
        adapted = model.predict_episode(x, y, x)
        assert model.loss(adapted, y) < start
    for a, b in zip(before, model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_pseudo_tasks_are_contiguous_slices_of_equal_regions() -> None:
    q, s = pseudo_task_sample(103, 5, 10, 4, torch.Generator().manual_seed(0))
    assert s.shape == (5, 10)
    assert q.shape == (5, 4)
    span = torch.cat([s, q], 1)  # support slice, then the query slice right after it
    assert torch.equal(span, span[:, :1] + torch.arange(14))
    region = torch.arange(5)[:, None] * 20  # 103 // 5 = 20 per region; the last 3 belong to none
    assert bool(((span >= region) & (span < region + 20)).all())
    with pytest.raises(ValueError, match="regions"):
        pseudo_task_sample(60, 5, 10, 4, torch.Generator())


def test_admission_probability_and_one_update_per_admitted_example() -> None:
    model = MAMLReplay(**TINY_MODEL, admission_prob=0.1, online_queries=0)
    calls = []
    model._maybe_update = lambda gen, run: calls.append(len(model.buffer))
    batch = (torch.randn(4000, 3), torch.randint(0, 2, (4000,)), torch.zeros(4000, dtype=torch.long))
    model.training_step(batch, 0)
    assert 330 < int(model.buffer.n_seen) < 470  # Binomial(4000, 0.1): 400 ± 3.5σ
    assert len(calls) == int(model.buffer.n_seen)


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="memory_size"):
        MAMLReplay(memory_size=50)
    with pytest.raises(ValueError, match="admission_prob"):
        MAMLReplay(admission_prob=0.0)


def test_maml_beats_chance_on_a_tiny_stream(tmp_path: Path) -> None:
    cli = fit(tmp_path, TINY)
    m = cli.trainer.callback_metrics
    assert torch.isfinite(m["train/loss"])
    assert m["eval/forward_acc"] > 0.25 + 0.2
    assert cli.trainer.global_step > 0
    assert not cli.model.automatic_optimization


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted(tmp_path: Path) -> None:
    assert_resume_equals_uninterrupted(tmp_path, TINY)


def test_checkpoint_round_trip_keeps_everything(tmp_path: Path) -> None:
    assert_checkpoint_round_trip(tmp_path, TINY, MAMLReplay)
