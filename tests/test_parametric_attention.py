from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import assert_checkpoint_round_trip, assert_resume_equals_uninterrupted, fit

import cl_lightning.learners.parametric_attention as pa
from cl_lightning.learners import ParametricAttention
from cl_lightning.ops import chunk_delta_rule

RULES = ["linear_attn", "decay", "delta_rule", "gated_delta_rule", "longhorn"]
PARAMETRIC = [
    "--model=cl_lightning.learners.ParametricAttention",
    "--model.rule=gated_delta_rule",
    "--model.hidden_sizes=[32]",
    "--model.key_dim=16",
    "--model.optimizer=torch.optim.Adam",
    "--model.optimizer.lr=0.003",
]


def _model(rule: str = "delta_rule", **kwargs) -> ParametricAttention:
    torch.manual_seed(0)
    args = {"input_shape": (6,), "num_outputs": 3, "hidden_sizes": [16], "key_dim": 8, "num_heads": 2}
    return ParametricAttention(rule=rule, chunk_size=4, **{**args, **kwargs}).double()


def _chunk(n: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=gen, dtype=torch.float64), torch.randint(0, 3, (n,), generator=gen)


def _changed_from(model: ParametricAttention, i: int) -> torch.Tensor:
    """Which online predictions change when only label i of the chunk changes (from a non-zero state)."""
    x, y = _chunk()
    state = torch.randn_like(model.fast_state)
    y2 = y.clone()
    y2[i] = (y[i] + 1) % 3
    with torch.no_grad():
        a, b = model.online_predictions(x, y, state)[0], model.online_predictions(x, y2, state)[0]
    return (a - b).abs().amax(-1) > 1e-9


@pytest.mark.parametrize("rule", RULES)
def test_predict_then_write_never_uses_a_label_for_its_own_prediction(rule: str) -> None:
    i = 5
    changed = _changed_from(_model(rule), i)
    assert not changed[: i + 1].any()  # example i and the ones before never see label i
    assert changed[i + 1 :].all()  # the later ones read it from the state: labels do flow forward


def test_the_leak_test_catches_read_after_write(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_after_write(*args, prequential: bool, **kwargs):  # a learner that reads after its own write
        return chunk_delta_rule(*args, prequential=False, **kwargs)

    monkeypatch.setattr(pa, "chunk_delta_rule", read_after_write)
    assert _changed_from(_model("delta_rule"), 5)[5]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("protocol", ["lifelong", "support_set"])
def test_chunked_stream_equals_one_example_at_a_time(rule: str, protocol: str) -> None:
    model = _model(rule, protocol=protocol)
    x, y = _chunk(13)
    with torch.no_grad():
        model.training_step((x, y, torch.zeros(13)), 0)  # one chunk: state S after 13 examples
        want_pred, want_state = model.online_predictions(x, y, model.fast_state)  # the next 13, chunked
        state, preds = model.fast_state.clone(), []
        for t in range(13):  # ... and one at a time, carrying the state
            pred, state = model.online_predictions(x[t : t + 1], y[t : t + 1], state)
            preds.append(pred)
    torch.testing.assert_close(torch.cat(preds), want_pred)
    torch.testing.assert_close(state, want_state)
    if protocol == "support_set":  # a fresh state per chunk: the first chunk's predictions start from zero
        torch.testing.assert_close(model.training_step((x, y, torch.zeros(13)), 1), model.loss(*_fresh(model, x, y)))


def _fresh(model: ParametricAttention, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return model.online_predictions(x, y, torch.zeros_like(model.fast_state))[0], y


@pytest.mark.parametrize("rule", ["delta_rule", "linear_attn"])
def test_delta_rule_with_unit_keys_and_beta_one_recalls_the_last_value(rule: str) -> None:
    model = _model(rule, num_heads=1)
    keys = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64))[0][:5]  # 5 orthonormal unit keys
    order = torch.tensor([0, 1, 2, 3, 4, 1, 3, 1])  # keys 1 and 3 are re-written with new labels
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 2, 0])
    values = model.values(labels, torch.float64)  # (1, 1, 8, 3) one-hot
    k = keys[order].view(1, 1, 8, 8)
    _, state = model.write(
        k, values, torch.ones(1, 1, 8, dtype=torch.float64), None, torch.zeros_like(model.fast_state)
    )
    logits = model.read(state, keys.view(1, 1, 5, 8)) / model.log_temperature.exp()
    last = torch.nn.functional.one_hot(torch.tensor([0, 0, 2, 2, 1]), 3).double()  # the last label of each key
    if rule == "delta_rule":
        torch.testing.assert_close(logits, last)
    else:  # Hebbian writes add up: key 1 reads 1 + 2 + 0 mixed, not its last value
        assert not torch.allclose(logits, last)


def test_evaluation_reads_both_ways_and_never_writes() -> None:
    model = _model("gated_delta_rule")
    x, y = _chunk(20)
    model.training_step((x, y, torch.zeros(20)), 0)
    before = model.fast_state.clone()
    with torch.no_grad():
        recontext = model.predict_episode(x[:12], y[:12], x[12:])
        live = model.extra_readings(x[:12], y[:12], x[12:])["live"]
    torch.testing.assert_close(model.fast_state, before)
    torch.testing.assert_close(live, model(x[12:]))  # no context: the live reading
    fresh = model.recontext_state(x[:12], y[:12])
    torch.testing.assert_close(recontext, model.read(fresh, model.encode(x[12:])[0]))
    assert not torch.allclose(recontext, live)


def test_context_memory_is_the_fixed_state_and_probes_are_the_encoder_layers() -> None:
    model = ParametricAttention(input_shape=(6,), num_outputs=3, hidden_sizes=[16, 16], key_dim=8, num_heads=2)
    assert model.context_memory_bytes() == 2 * 8 * 3 * 4  # H x K x V float32, whatever the stream length
    assert list(model.probe_layers().values()) == list(model.body.layers)


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="key_dim"):
        ParametricAttention(key_dim=0)
    with pytest.raises(ValueError, match="temperature"):
        ParametricAttention(temperature=0.0)


@pytest.mark.parametrize("rule", ["delta_rule", "gated_delta_rule"])
def test_learner_beats_chance_on_a_tiny_stream(tmp_path: Path, rule: str) -> None:
    args = [*PARAMETRIC, f"--model.rule={rule}"]
    m = fit(tmp_path, args).trainer.callback_metrics
    assert torch.isfinite(m["train/loss"])
    for name in ("eval/forward_acc", "eval/forward_live_acc", "train/online_acc"):
        assert m[name] > 0.25 + 0.2, name  # 4 classes
    assert "eval/backward_live_acc" in m
    assert "eval/live_acc_matrix/task_0" in m


def test_resumed_run_equals_uninterrupted(tmp_path: Path) -> None:
    assert_resume_equals_uninterrupted(tmp_path, PARAMETRIC)


def test_checkpoint_round_trip_keeps_everything(tmp_path: Path) -> None:
    assert_checkpoint_round_trip(tmp_path, PARAMETRIC, ParametricAttention)
