from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import FULL_ATTENTION, assert_checkpoint_round_trip, assert_resume_equals_uninterrupted, fit

from cl_lightning.learners import FullAttention
from cl_lightning.learners.engines import StepRun

TINY = FULL_ATTENTION


def _model(isolate: str, task_type: str = "classification") -> FullAttention:
    torch.manual_seed(0)
    return FullAttention(
        input_shape=(5,),
        num_outputs=3,
        task_type=task_type,
        memory_size=20,
        support_size=9,
        num_layers=3,
        isolate_queries=isolate,
    ).double()


@pytest.mark.parametrize("isolate", ["sequence", "mask"])
def test_batched_queries_equal_one_at_a_time_and_sdpa_equals_manual(isolate: str) -> None:
    model = _model(isolate)
    sx, sy, qx = torch.rand(9, 5, dtype=torch.float64), torch.randint(0, 3, (9,)), torch.rand(4, 5, dtype=torch.float64)
    together = model.attend(qx, sx, sy)
    alone = torch.cat([model.attend(qx[i : i + 1], sx, sy) for i in range(4)])
    torch.testing.assert_close(together, alone)
    torch.testing.assert_close(together, model.attend(qx, sx, sy, fast=False))


def test_sequence_mode_is_the_authors_unmasked_model() -> None:
    model = _model("sequence")
    sx, sy, qx = torch.rand(9, 5, dtype=torch.float64), torch.randint(0, 3, (9,)), torch.rand(1, 5, dtype=torch.float64)
    tokens = torch.cat(
        [torch.cat([sx, torch.nn.functional.one_hot(sy, 3).double()], 1), torch.cat([qx, qx.new_zeros(1, 3)], 1)]
    )
    out = tokens[None]
    for q, k, v in zip(model.transformer.q, model.transformer.k, model.transformer.v, strict=True):
        a = (q(out) @ k(out).transpose(1, 2) / 8**0.5).softmax(-1)  # width 5 + 3 = 8, no mask
        out = out + a @ v(out)
    torch.testing.assert_close(model.attend(qx, sx, sy), out[:, -1, -3:])
    assert not torch.allclose(model.attend(qx, sx, sy), _model("mask").attend(qx, sx, sy))


def test_tokens_are_x_and_onehot_label_and_query_slot_is_zero() -> None:
    model = _model("mask")
    x, y = torch.rand(2, 5, dtype=torch.float64), torch.tensor([2, 0])
    torch.testing.assert_close(model.tokens(x, y), torch.cat([x, torch.tensor([[0.0, 0, 1], [1, 0, 0]]).double()], 1))
    torch.testing.assert_close(model.tokens(x)[:, 5:], torch.zeros(2, 3, dtype=torch.float64))
    reg = _model("mask", task_type="regression")
    targets = torch.rand(2, 3, dtype=torch.float64)
    torch.testing.assert_close(reg.tokens(x, targets)[:, 5:], targets)


def test_paper_defaults() -> None:
    model = FullAttention()
    assert model.transformer.width == 59
    assert sum(p.numel() for p in model.parameters()) == 106_200  # docs/baselines.md §5
    assert model.configure_optimizers().defaults["lr"] == 5e-4
    assert model.buffer.capacity == 100
    assert model.support_size == 99
    assert model.admit_last == 100


def test_only_the_chunk_tail_enters_the_buffer_and_the_newest_is_the_query(monkeypatch: pytest.MonkeyPatch) -> None:
    model = FullAttention(input_shape=(2,), num_outputs=2, memory_size=4, support_size=3, admit_last=4, num_layers=1)
    x = torch.arange(20.0).reshape(10, 2)
    steps = []
    # the optimiser step needs a Trainer; the loss it would take is recorded
    monkeypatch.setattr(StepRun, "step", lambda run, loss: steps.append(loss))
    out = model.training_step((x, torch.zeros(10, dtype=torch.long), torch.zeros(10, dtype=torch.long)), 0)
    assert len(steps) == 1
    assert torch.equal(out, steps[0].detach())
    stored, _ = model.buffer.get(torch.arange(4))
    torch.testing.assert_close(stored, x[-4:])


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="memory_size"):
        FullAttention(memory_size=50, support_size=99)


def test_full_attention_beats_chance_on_a_tiny_stream(tmp_path: Path) -> None:
    cli = fit(tmp_path, TINY)
    m = cli.trainer.callback_metrics
    assert torch.isfinite(m["train/loss"])
    assert m["eval/forward_acc"] > 0.25 + 0.2  # each task relabels the blobs: it must read the support labels


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted(tmp_path: Path) -> None:
    assert_resume_equals_uninterrupted(tmp_path, TINY)


def test_checkpoint_round_trip_keeps_everything(tmp_path: Path) -> None:
    assert_checkpoint_round_trip(tmp_path, TINY, FullAttention)
