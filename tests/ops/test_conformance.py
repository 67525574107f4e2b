"""The contract every parametric-attention rule meets, over one table of rules.

Each rule's chunked form matches its token-by-token reference (outputs, final state, gradients; float64); a
prequential read never sees its own token's value; a rule with its extra term switched off is the simpler rule; gates
that would overflow a naive chunked form stay finite; bad sizes raise. Rule-specific checks stay in test_<rule>.py.
"""

from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, NamedTuple

import pytest
import torch
from torch import Tensor

from cl_lightning.ops.decay import chunk_decay_linear_attn, naive_recurrent_decay_linear_attn
from cl_lightning.ops.delta_rule import chunk_delta_rule, naive_recurrent_delta_rule
from cl_lightning.ops.gated_delta_rule import chunk_gated_delta_rule, naive_recurrent_gated_delta_rule
from cl_lightning.ops.linear_attn import chunk_linear_attn, naive_recurrent_linear_attn
from cl_lightning.ops.longhorn import chunk_longhorn, naive_recurrent_longhorn
from cl_lightning.ops.omega import chunk_omega_rule, naive_recurrent_omega_rule
from cl_lightning.ops.titans import chunk_titans_linear, naive_recurrent_titans_linear
from cl_lightning.ops.ttt_linear import chunk_ttt_linear, naive_recurrent_ttt_linear
from cl_lightning.ops.ttt_mlp import chunk_ttt_mlp, naive_recurrent_ttt_mlp

Op = Callable[..., Any]
LEAK_SHAPE, LEAK_CHUNK = (2, 8, 2, 4), 4  # steps 0, 3 (chunk end) and 5 (inside a chunk)


def _sizes(options: dict[str, Any], chunk_size: int) -> dict[str, Any]:
    """A chunked form's extra options: its chunk size, unless a mini-batch size (given to both forms) sets it."""
    return {} if "mini_batch_size" in options else {"chunk_size": chunk_size}


def _packed(fn: Op, names: tuple[str, ...]) -> Op:
    """``fn`` with a tuple ``initial_state`` taken from the tensors ``names`` (so each gets its own gradient)."""
    if not names:
        return fn

    def run(**tensors: Tensor) -> Any:
        return fn(initial_state=tuple(tensors.pop(name) for name in names), **tensors)

    return run


# --- the tensors each rule is checked on ---
def _longhorn(inputs, *beta_features: int) -> dict[str, Tensor]:
    beta = inputs.beta(*beta_features)  # per head, or per channel as in the paper's code
    return inputs.rule_inputs(k=inputs.queries(), beta=beta)  # Longhorn keys are not normalised


def _omega(inputs, window: int) -> dict[str, Tensor]:
    return inputs.rule_inputs(beta=inputs.beta() / window, gamma=inputs.beta())  # eta * sum(gamma) < 1: contractive


def _titans(inputs) -> dict[str, Tensor]:
    base = {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.values(), "beta": 0.5 * inputs.beta()}
    gates = {"log_momentum": inputs.log_gate(), "log_retain": inputs.log_gate()}
    return {**base, **gates, "w0": inputs.state(), "m0": 0.1 * inputs.state()}


def _ttt_linear(inputs) -> dict[str, Tensor]:
    heads, dim = inputs.heads, inputs.dim
    base = {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.queries(), "beta": 0.5 * inputs.beta()}  # V == K
    norm = {"ln_weight": 1.0 + 0.1 * inputs.normal(heads, dim), "ln_bias": 0.1 * inputs.normal(heads, dim)}
    state = {
        "w0": 0.1 * inputs.normal(inputs.batch, heads, dim, dim),
        "b0": 0.1 * inputs.normal(inputs.batch, heads, dim),
    }
    return {**base, **norm, **state}


def _ttt_mlp(inputs) -> dict[str, Tensor]:
    return inputs.mlp_rule_inputs()


def _position_scale(offset: float) -> Callable[[Any], dict[str, Tensor]]:
    return lambda inputs: {"position_scale": 1.0 / torch.arange(1.0, 5.0, dtype=torch.float64) + offset}


class Case(NamedTuple):
    """A rule's two forms, the tensors to check them on and their options (both forms get them)."""

    naive: Op
    chunked: Op
    tensors: Callable[[Any], dict[str, Tensor]]
    options: Mapping[str, Any] = MappingProxyType({})
    state: tuple[str, ...] = ()  # tensor names packed into a tuple initial_state


LINEAR = (naive_recurrent_linear_attn, chunk_linear_attn)
DECAY = (naive_recurrent_decay_linear_attn, chunk_decay_linear_attn)
DELTA = (naive_recurrent_delta_rule, chunk_delta_rule)
GATED = (naive_recurrent_gated_delta_rule, chunk_gated_delta_rule)
LONGHORN = (naive_recurrent_longhorn, chunk_longhorn)
OMEGA = (naive_recurrent_omega_rule, chunk_omega_rule)
TITANS = (naive_recurrent_titans_linear, chunk_titans_linear)
TTT_LINEAR = (naive_recurrent_ttt_linear, chunk_ttt_linear)
TTT_MLP = (naive_recurrent_ttt_mlp, chunk_ttt_mlp)

CASES: dict[str, Case] = {
    "linear_attn": Case(*LINEAR, lambda inputs: inputs.rule_inputs()),
    "linear_attn-no-beta-no-state": Case(
        *LINEAR, lambda inputs: {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.values()}
    ),
    "decay-scalar": Case(*DECAY, lambda inputs: inputs.rule_inputs(g=inputs.log_gate())),
    "decay-vector": Case(*DECAY, lambda inputs: inputs.rule_inputs(g=inputs.log_gate(inputs.dim))),
    "delta_rule": Case(*DELTA, lambda inputs: inputs.rule_inputs()),
    "gated_delta_rule": Case(*GATED, lambda inputs: inputs.rule_inputs(g=inputs.log_gate())),
    "longhorn-per-head": Case(*LONGHORN, _longhorn),
    "longhorn-per-channel": Case(*LONGHORN, lambda inputs: _longhorn(inputs, inputs.value_dim)),
    **{f"omega-window{c}": Case(*OMEGA, partial(_omega, window=c), {"window": c}) for c in (1, 3, 5)},
    **{f"titans-mb{m}": Case(*TITANS, _titans, {"mini_batch_size": m}, ("w0", "m0")) for m in (16, 5, 1)},
    **{f"ttt_linear-mb{m}": Case(*TTT_LINEAR, _ttt_linear, {"mini_batch_size": m}, ("w0", "b0")) for m in (16, 5)},
    **{
        f"ttt_mlp-mb{m}": Case(*TTT_MLP, _ttt_mlp, {"mini_batch_size": m}, ("w1", "b1", "w2", "b2")) for m in (16, 5, 1)
    },
}
# Position scales tau on a T that is not a multiple of the mini-batch of 4 (one shape only).
POSITION_SCALE_CASES: dict[str, Case] = {
    "ttt_linear-learned-position-scale": Case(
        *TTT_LINEAR,
        lambda inputs: {**_ttt_linear(inputs), **_position_scale(0.1)(inputs)},
        {"mini_batch_size": 4},
        ("w0", "b0"),
    ),
    "ttt_mlp-position-scale": Case(
        *TTT_MLP,
        lambda inputs: {**_ttt_mlp(inputs), **_position_scale(0.0)(inputs)},
        {"mini_batch_size": 4},
        ("w1", "b1", "w2", "b2"),
    ),
}


def _check_case(case: Case, inputs, prequential: bool, chunk_size: int, check_reference: Callable[..., None]) -> None:
    options = {"prequential": prequential, **case.options}
    check_reference(
        _packed(partial(case.naive, **options), case.state),
        _packed(partial(case.chunked, **options, **_sizes(options, chunk_size)), case.state),
        case.tensors(inputs),
    )


@pytest.mark.parametrize("case", CASES.values(), ids=CASES)
def test_chunk_matches_reference(case, inputs, prequential, chunk_size, check_reference):
    _check_case(case, inputs, prequential, chunk_size, check_reference)


@pytest.mark.parametrize("case", POSITION_SCALE_CASES.values(), ids=POSITION_SCALE_CASES)
def test_chunk_matches_reference_with_position_scale(case, make_inputs, prequential, chunk_size, check_reference):
    _check_case(case, make_inputs((2, 11, 2, 4)), prequential, chunk_size, check_reference)


def _ttt_linear_leak(inputs) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors = {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.queries(), "beta": inputs.beta()}
    state = (0.3 * inputs.normal(2, 2, 4, 4), 0.3 * inputs.normal(2, 2, 4))  # W = 0 makes LN(k W + b) degenerate
    return tensors, {"initial_state": state, "mini_batch_size": LEAK_CHUNK}


def _ttt_mlp_leak(inputs) -> tuple[dict[str, Tensor], dict[str, Any]]:
    t = _ttt_mlp(inputs)
    state = (t["w1"], t["b1"], t["w2"], t["b2"])
    return {n: t[n] for n in ("q", "k", "v", "beta")}, {"initial_state": state, "mini_batch_size": LEAK_CHUNK}


def _qkv(inputs) -> dict[str, Tensor]:
    return {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.values()}


# name -> (naive, chunked, make(inputs) -> (tensors, options of both forms))
LEAK_CASES: dict[str, tuple[Op, Op, Callable[[Any], tuple[dict[str, Tensor], dict[str, Any]]]]] = {
    "linear_attn": (*LINEAR, lambda inputs: ({**_qkv(inputs), "beta": inputs.beta()}, {})),
    "decay": (*DECAY, lambda inputs: ({**_qkv(inputs), "g": inputs.log_gate(4)}, {})),
    "delta_rule": (*DELTA, lambda inputs: ({**_qkv(inputs), "beta": inputs.beta()}, {})),
    "gated_delta_rule": (*GATED, lambda inputs: ({**_qkv(inputs), "beta": inputs.beta(), "g": inputs.log_gate()}, {})),
    "longhorn": (
        *LONGHORN,
        lambda inputs: (
            {"q": inputs.queries(), "k": inputs.queries(), "v": inputs.values(), "beta": inputs.beta()},
            {},
        ),
    ),
    "omega": (*OMEGA, lambda inputs: ({**_qkv(inputs), "beta": inputs.beta() / 3}, {"window": 3})),
    "titans": (
        *TITANS,
        lambda inputs: (
            {**_qkv(inputs), "beta": inputs.beta()},
            {"log_momentum": inputs.log_gate(), "mini_batch_size": LEAK_CHUNK},
        ),
    ),
    "ttt_linear": (*TTT_LINEAR, _ttt_linear_leak),
    "ttt_mlp": (*TTT_MLP, _ttt_mlp_leak),
}


@pytest.mark.parametrize("step", [0, 3, 5])
@pytest.mark.parametrize("form", ["naive", "chunk"])
@pytest.mark.parametrize("rule", LEAK_CASES)
def test_prequential_never_reads_own_value(rule, form, step, make_inputs, check_no_leak, check_own_value):
    naive, chunked, make = LEAK_CASES[rule]
    tensors, options = make(make_inputs(LEAK_SHAPE))
    fn = partial(naive, **options) if form == "naive" else partial(chunked, **options, **_sizes(options, LEAK_CHUNK))
    check_no_leak(partial(fn, prequential=True), tensors, step)
    check_own_value(partial(fn, prequential=False), tensors, step)


# name -> (the rule's two forms, its switch-off options, the simpler rule's two forms, what to compare of the output):
# no decay is linear attention / the delta rule; a window of 1, or Titans without momentum or decay on one-token
# mini-batches, is the delta rule.
REDUCTIONS: dict[str, tuple[tuple[Op, Op], Callable[[Any, Tensor], dict[str, Any]], tuple[Op, Op], Op]] = {
    "decay-scalar-zero-gate": (
        DECAY,
        lambda inputs, beta: {"g": torch.zeros_like(inputs.log_gate())},
        LINEAR,
        lambda out: out,
    ),
    "decay-vector-zero-gate": (
        DECAY,
        lambda inputs, beta: {"g": torch.zeros_like(inputs.log_gate(inputs.dim))},
        LINEAR,
        lambda out: out,
    ),
    "gated_delta_rule-unit-gate": (GATED, lambda inputs, beta: {"g": torch.zeros_like(beta)}, DELTA, lambda out: out),
    "omega-window-one": (OMEGA, lambda inputs, beta: {"window": 1}, (chunk_delta_rule,) * 2, lambda out: out),
    "titans-no-momentum-no-decay-one-token-batches": (
        TITANS,
        lambda inputs, beta: {"log_momentum": torch.full_like(beta, -200.0), "mini_batch_size": 1},  # mu = e^-200
        (chunk_delta_rule,) * 2,
        lambda out: (out[0], out[1][0]),  # outputs and W
    ),
}


@pytest.mark.parametrize("form", ["naive", "chunk"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_switched_off_term_is_the_simpler_rule(reduction, form, inputs, prequential, chunk_size):
    forms, switch_off, simpler_forms, pick = REDUCTIONS[reduction]
    base = inputs.rule_inputs()
    options = switch_off(inputs, base["beta"])
    if "mini_batch_size" in options:  # Titans: its initial state is (W_0, M_0)
        options["initial_state"] = (base["initial_state"], torch.zeros_like(base["initial_state"]))
    fn, simpler = (forms[0], simpler_forms[0]) if form == "naive" else (forms[1], simpler_forms[1])
    sizes = {} if form == "naive" else _sizes(options, chunk_size)
    got = fn(**{**base, **options}, prequential=prequential, **sizes)
    simpler_sizes = {"chunk_size": chunk_size} if simpler is chunk_delta_rule or form == "chunk" else {}
    torch.testing.assert_close(pick(got), simpler(**base, prequential=prequential, **simpler_sizes))


@pytest.mark.parametrize(
    ("naive", "chunked", "gate"),
    [(*DECAY, "scalar"), (*DECAY, "vector"), (*GATED, "scalar")],
    ids=["decay-scalar", "decay-vector", "gated_delta_rule"],
)
def test_strong_decay_stays_finite(naive, chunked, gate, make_inputs, chunk_size):
    inputs = make_inputs((1, 40, 1, 4))
    tensors = inputs.rule_inputs()
    del tensors["initial_state"]
    if naive is naive_recurrent_decay_linear_attn:
        del tensors["beta"]
    g = torch.full_like(inputs.log_gate() if gate == "scalar" else inputs.log_gate(4), -60.0)  # exp(-cumsum) overflows
    o, state = chunked(**tensors, g=g, chunk_size=chunk_size)
    ref_o, ref_state = naive(**tensors, g=g)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, ref_o)
    torch.testing.assert_close(state, ref_state)


@pytest.mark.parametrize("rule", ["delta_rule", "gated_delta_rule"])
def test_gradcheck_chunk(rule, make_inputs):
    inputs = make_inputs((1, 5, 1, 3))
    tensors = [inputs.queries(), inputs.keys(), inputs.values(), inputs.beta()]
    tensors += [inputs.log_gate()] if rule == "gated_delta_rule" else []
    tensors = tuple(x.requires_grad_(True) for x in [*tensors, inputs.state()])
    fn = chunk_gated_delta_rule if rule == "gated_delta_rule" else chunk_delta_rule
    assert torch.autograd.gradcheck(partial(fn, chunk_size=2), tensors, fast_mode=True)


@pytest.mark.parametrize(
    ("fn", "options", "match"),
    [
        (chunk_omega_rule, {"window": 0}, "window"),
        (chunk_titans_linear, {"mini_batch_size": 0}, "mini_batch_size"),
        (chunk_ttt_linear, {"mini_batch_size": 0}, "mini_batch_size"),
    ],
    ids=["omega-window", "titans-mini-batch", "ttt_linear-mini-batch"],
)
def test_bad_size_raises(fn, options, match, make_inputs):
    inputs = make_inputs((1, 3, 1, 4))
    v = inputs.queries() if fn is chunk_ttt_linear else inputs.values()  # TTT-Linear needs V == K
    with pytest.raises(ValueError, match=match):
        fn(inputs.queries(), inputs.keys(), v, inputs.beta(), **options)
