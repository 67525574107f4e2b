from functools import partial

import pytest
import torch

from cl_lightning.ops.delta_rule import chunk_delta_rule, naive_recurrent_delta_rule
from cl_lightning.ops.gated_delta_rule import chunk_gated_delta_rule, naive_recurrent_gated_delta_rule

LEAK_T, LEAK_CHUNK = 8, 4


def test_chunk_matches_reference(inputs, check_forms):
    check_forms(naive_recurrent_gated_delta_rule, chunk_gated_delta_rule, inputs.rule_inputs(g=inputs.log_gate()))


@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_unit_gate_equals_delta_rule(form, inputs, prequential, chunk_size):
    q, k, v, beta, s0 = inputs.queries(), inputs.keys(), inputs.values(), inputs.beta(), inputs.state()
    g = torch.zeros_like(beta)  # alpha = exp(0) = 1
    if form == "naive":
        got = naive_recurrent_gated_delta_rule(q, k, v, beta, g, s0, prequential)
        want = naive_recurrent_delta_rule(q, k, v, beta, s0, prequential)
    else:
        got = chunk_gated_delta_rule(q, k, v, beta, g, s0, prequential, chunk_size)
        want = chunk_delta_rule(q, k, v, beta, s0, prequential, chunk_size)
    torch.testing.assert_close(got, want)


def test_strong_decay_stays_finite(make_inputs, chunk_size):
    inputs = make_inputs((1, 40, 1, 4))
    q, k, v, beta = inputs.queries(), inputs.keys(), inputs.values(), inputs.beta()
    g = torch.full_like(beta, -60.0)  # exp(-cumsum) over a chunk of 16 would overflow float64
    o, state = chunk_gated_delta_rule(q, k, v, beta, g, chunk_size=chunk_size)
    ref_o, ref_state = naive_recurrent_gated_delta_rule(q, k, v, beta, g)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, ref_o)
    torch.testing.assert_close(state, ref_state)


def test_gradcheck_chunk(make_inputs):
    inputs = make_inputs((1, 5, 1, 3))
    tensors = (inputs.queries(), inputs.keys(), inputs.values(), inputs.beta(), inputs.log_gate(), inputs.state())
    tensors = tuple(x.requires_grad_(True) for x in tensors)
    assert torch.autograd.gradcheck(partial(chunk_gated_delta_rule, chunk_size=2), tensors, fast_mode=True)


@pytest.mark.parametrize("step", [0, 3, 5])
@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_prequential_never_reads_own_value(form, step, make_inputs, check_no_leak, check_own_value):
    inputs = make_inputs((2, LEAK_T, 2, 4))
    tensors = {
        "q": inputs.queries(),
        "k": inputs.keys(),
        "v": inputs.values(),
        "beta": inputs.beta(),
        "g": inputs.log_gate(),
    }
    fn = naive_recurrent_gated_delta_rule if form == "naive" else partial(chunk_gated_delta_rule, chunk_size=LEAK_CHUNK)
    check_no_leak(partial(fn, prequential=True), tensors, step)
    check_own_value(partial(fn, prequential=False), tensors, step)
