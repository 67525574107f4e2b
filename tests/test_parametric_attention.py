from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from helpers import PARAMETRIC, assert_checkpoint_round_trip, assert_resume_equals_uninterrupted, fit

from cl_lightning.learners import ParametricAttention
from cl_lightning.learners.base import taken_arguments
from cl_lightning.nn import fast_weights as fw
from cl_lightning.ops import chunk_delta_rule


def _rules(cls: type = fw.FastWeightRule) -> list[type]:
    """Every rule class the learner accepts: the concrete subclasses of ``FastWeightRule``."""
    subs = [r for sub in cls.__subclasses__() for r in (sub, *_rules(sub))]
    return sorted({r for r in subs if not inspect.isabstract(r)}, key=lambda r: r.__name__)


RULES = _rules()
# the rules whose gradients are taken per mini-batch or window: one call per example matches one call per chunk only
# with mini-batches / windows of one token (the ops tests check the chunked forms against their references)
ONE_TOKEN = {"window": 1, "mini_batch_size": 1}


def _rule(cls: type, **kwargs) -> fw.FastWeightRule:
    """``cls`` with ops' chunks of 4 tokens where it has chunks, and those of ``kwargs`` it takes."""
    params = taken_arguments(cls, fw.FastWeightRule)
    return cls(**{k: v for k, v in {"chunk_size": 4, **kwargs}.items() if k in params})


def _model(rule: type | fw.FastWeightRule = fw.DeltaRule, **kwargs) -> ParametricAttention:
    torch.manual_seed(0)
    args = {"input_shape": (6,), "num_outputs": 3, "hidden_sizes": [16], "key_dim": 8, "num_heads": 2}
    rule = _rule(rule) if isinstance(rule, type) else rule
    return ParametricAttention(rule=rule, **{**args, **kwargs}).double()


def _chunk(n: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=gen, dtype=torch.float64), torch.randint(0, 3, (n,), generator=gen)


def _changed_from(model: ParametricAttention, i: int) -> torch.Tensor:
    """Which online predictions change when only label i of the chunk changes (from a non-zero state)."""
    x, y = _chunk()
    torch.manual_seed(2)
    state = tuple(torch.randn_like(t) for t in _tuple(model.live_state()))
    state = state[0] if len(state) == 1 else state
    y2 = y.clone()
    y2[i] = (y[i] + 1) % 3
    with torch.no_grad():
        a, b = model.online_predictions(x, y, state)[0], model.online_predictions(x, y2, state)[0]
    return (a - b).abs().amax(-1) > 1e-9


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("kv_pairs", [1, 2])
def test_predict_then_write_never_uses_a_label_for_its_own_prediction(rule: type, kv_pairs: int) -> None:
    if kv_pairs > 1 and not rule.linear_readout:
        pytest.skip("several pairs per example need a linear readout")
    i = 5
    changed = _changed_from(_model(rule, kv_pairs=kv_pairs), i)
    assert not changed[: i + 1].any()  # example i and the ones before never see label i
    assert changed[i + 1 :].all()  # the later ones read it from the state: labels do flow forward


def test_the_leak_test_catches_read_after_write(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_after_write(*args, prequential: bool, **kwargs):  # a learner that reads after its own write
        return chunk_delta_rule(*args, prequential=False, **kwargs)

    monkeypatch.setattr(fw.DeltaRule, "op", staticmethod(read_after_write))
    assert _changed_from(_model(fw.DeltaRule), 5)[5]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("protocol", ["lifelong", "support_set"])
def test_chunked_stream_equals_one_example_at_a_time(rule: type, protocol: str) -> None:
    model = _model(_rule(rule, **ONE_TOKEN), protocol=protocol)
    x, y = _chunk(13)
    with torch.no_grad():
        model.training_step((x, y, torch.zeros(13)), 0)  # one chunk: state S after 13 examples
        want_pred, want_state = model.online_predictions(x, y, model.live_state())  # the next 13, chunked
        state, preds = model.live_state(), []
        for t in range(13):  # ... and one at a time, carrying the state
            pred, state = model.online_predictions(x[t : t + 1], y[t : t + 1], state)
            preds.append(pred)
    torch.testing.assert_close(torch.cat(preds), want_pred)
    torch.testing.assert_close(state, want_state)
    if protocol == "support_set":  # a fresh state per chunk: the first chunk's predictions start from zero
        torch.testing.assert_close(model.training_step((x, y, torch.zeros(13)), 1), model.loss(*_fresh(model, x, y)))


def _tuple(state):
    return (state,) if isinstance(state, torch.Tensor) else tuple(state)


def _fresh(model: ParametricAttention, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return model.online_predictions(x, y, model.fresh_state())[0], y


@pytest.mark.parametrize("rule", [fw.DeltaRule, fw.LinearAttention])
def test_delta_rule_with_unit_keys_and_beta_one_recalls_the_last_value(rule: type) -> None:
    model = _model(rule, num_heads=1)
    keys = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64))[0][:5]  # 5 orthonormal unit keys
    order = torch.tensor([0, 1, 2, 3, 4, 1, 3, 1])  # keys 1 and 3 are re-written with new labels
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 2, 0])
    values = model.values(labels, torch.float64)  # (1, 1, 8, 3) one-hot
    k = keys[order].view(1, 1, 8, 8)
    _, state = model.write(fw.Encoded(k, torch.ones(1, 1, 8, dtype=torch.float64)), values, model.fresh_state())
    logits = model.read(state, keys.view(1, 1, 5, 8)) / model.log_temperature.exp()
    last = torch.nn.functional.one_hot(torch.tensor([0, 0, 2, 2, 1]), 3).double()  # the last label of each key
    if rule is fw.DeltaRule:
        torch.testing.assert_close(logits, last)
    else:  # Hebbian writes add up: key 1 reads 1 + 2 + 0 mixed, not its last value
        assert not torch.allclose(logits, last)


def test_evaluation_reads_both_ways_and_never_writes() -> None:
    model = _model(fw.GatedDeltaRule)
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
    with pytest.raises(ValueError, match="window"):
        fw.OmegaRule(window=0)
    with pytest.raises(ValueError, match="momentum_init"):
        fw.Titans(momentum_init=1.0)


def test_the_rules_slow_weights_keep_their_checkpoint_keys() -> None:
    """A rule's gates and slow weights are registered on the learner under their own names, in a fixed order."""
    assert list(_model(fw.Titans).state_dict()) == [
        "log_temperature", "a_log", "dt_bias", "momentum_bias", "steps_taken", "fast_state", "fast_momentum",
        "body.layers.0.weight", "body.layers.0.bias", "key_proj.weight", "key_proj.bias", "beta_proj.weight",
        "beta_proj.bias", "gate_proj.weight", "gate_proj.bias", "momentum_proj.weight", "momentum_proj.bias",
    ]  # fmt: skip
    assert list(_model(fw.TTTLinear).state_dict()) == [
        "log_temperature", "ln_weight", "ln_bias", "steps_taken", "fast_state", "fast_bias", "body.layers.0.weight",
        "body.layers.0.bias", "key_proj.weight", "key_proj.bias", "beta_proj.weight", "beta_proj.bias",
        "value_embed.weight", "state_init.0", "state_init.1",
    ]  # fmt: skip


@pytest.mark.parametrize("rule", ["DeltaRule", "GatedDeltaRule"])
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


@pytest.mark.parametrize("rule", [fw.Titans, fw.TTTLinear, fw.TTTMLP, fw.OmegaRule])
def test_evaluation_never_writes_any_state_buffer(rule: type) -> None:
    model = _model(rule)
    x, y = _chunk(20)
    model.training_step((x, y, torch.zeros(20)), 0)
    before = [t.clone() for t in _tuple(model.live_state())]
    with torch.no_grad():
        model.predict_episode(x[:12], y[:12], x[12:])
        live = model.extra_readings(x[:12], y[:12], x[12:])["live"]
    for got, want in zip(_tuple(model.live_state()), before, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(live, model(x[12:]))


@pytest.mark.parametrize(("rule", "extra"), [(fw.OmegaRule(window=3), {}), (fw.DeltaRule(), {"kv_pairs": 3})])
def test_the_ops_chunk_size_does_not_change_the_learner(rule: fw.FastWeightRule, extra: dict) -> None:
    x, y = _chunk(13)
    outs = []
    for chunk_size in (4, 64):
        rule.chunk_size = chunk_size
        model = _model(rule, **extra)
        with torch.no_grad():
            outs.append(model.online_predictions(x, y, model.fresh_state()))
    torch.testing.assert_close(outs[0], outs[1])


def test_state_bytes_count_every_buffer_of_the_state() -> None:
    kw = {"input_shape": (6,), "num_outputs": 3, "hidden_sizes": [16], "key_dim": 8, "num_heads": 2}
    assert ParametricAttention(rule=fw.Titans(), **kw).context_memory_bytes() == 2 * (2 * 8 * 3) * 4  # W and momentum
    mlp = ParametricAttention(rule=fw.TTTMLP(hidden=5), **kw)
    assert mlp.context_memory_bytes() == 2 * (8 * 5 + 5 + 5 * 3 + 3) * 4  # W1, b1, W2, b2 per head
    assert ParametricAttention(rule=fw.TTTLinear(), **kw).context_memory_bytes() == 2 * (8 * 8 + 8) * 4


@pytest.mark.parametrize("name", ["elu1", "poly2", "random_fourier"])
def test_feature_maps_give_unit_keys_of_state_width(name: str) -> None:
    model = _model(fw.DeltaRule, key_dim=16, feature_map=name)
    keys = model.encode(_chunk()[0]).keys
    assert keys.shape[-1] == 16
    assert model.key_proj.out_features == model.num_heads * (4 if name == "poly2" else 16)
    torch.testing.assert_close(keys.norm(dim=-1), torch.ones_like(keys[..., 0]), atol=1e-3, rtol=0)  # l2n eps 1e-6
    if name == "elu1":
        assert (keys > 0).all()
    if name == "poly2":  # phi(q)^T phi(k) = (q^T k)^2 >= 0: no two keys point apart
        assert (keys[0, 0] @ keys[0, 0].T).min() >= 0


def test_poly2_needs_a_square_key_dim() -> None:
    with pytest.raises(ValueError, match="perfect square"):
        ParametricAttention(key_dim=12, feature_map="poly2")
    with pytest.raises(ValueError, match="linear readout"):
        ParametricAttention(rule=fw.TTTMLP(), kv_pairs=2)


def test_frozen_random_encoder_keeps_its_keys_and_trains_the_rest() -> None:
    model = _model(fw.GatedDeltaRule, encoder_training="frozen_random")
    optimizer = model.configure_optimizers()
    key_w, beta_w = model.key_proj.weight.clone(), model.beta_proj.weight.clone()
    x, y = _chunk(20)
    for i in range(3):
        optimizer.zero_grad()
        model.training_step((x, y, torch.zeros(20)), i).backward()
        optimizer.step()
    torch.testing.assert_close(model.key_proj.weight, key_w)
    assert not torch.allclose(model.beta_proj.weight, beta_w)


def test_frozen_after_first_task_trains_keys_in_task_0_only(tmp_path: Path) -> None:
    from lightning.pytorch import Callback

    seen: list[torch.Tensor] = []

    class Record(Callback):
        def on_train_epoch_end(self, trainer, module) -> None:
            seen.append(module.key_proj.weight.detach().clone())

    args = [*PARAMETRIC, "--model.encoder_training=frozen_after_first_task"]
    from helpers import tiny_args

    from cl_lightning.run.cli import main

    cli = main(tiny_args(tmp_path, args), run=False)
    init = cli.model.key_proj.weight.detach().clone()
    cli.trainer.callbacks.append(Record())
    cli.trainer.fit(cli.model, cli.datamodule)
    assert len(seen) == 3
    assert not torch.allclose(seen[0], init)  # task 0 trains the key path
    torch.testing.assert_close(seen[1], seen[0])  # ... later tasks do not
    torch.testing.assert_close(seen[2], seen[0])


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["OmegaRule", "Titans", "TTTLinear", "TTTMLP"])
def test_new_rules_beat_chance_on_a_tiny_stream(tmp_path: Path, rule: str) -> None:
    m = fit(tmp_path, [*PARAMETRIC, f"--model.rule={rule}"]).trainer.callback_metrics
    assert torch.isfinite(m["train/loss"])
    assert m["eval/forward_acc"] > 0.25 + 0.2  # 4 classes; recontext reading
