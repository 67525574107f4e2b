from functools import partial

import pytest
import torch

from cl_lightning.ops.decay import chunk_decay_linear_attn, naive_recurrent_decay_linear_attn
from cl_lightning.ops.linear_attn import chunk_linear_attn, naive_recurrent_linear_attn

LEAK_T, LEAK_CHUNK = 8, 4


def _gate(inputs, gate: str):
    return inputs.log_gate() if gate == "scalar" else inputs.log_gate(inputs.dim)


@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_chunk_matches_reference(gate, inputs, check_forms):
    check_forms(naive_recurrent_decay_linear_attn, chunk_decay_linear_attn, inputs.rule_inputs(g=_gate(inputs, gate)))


@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_strong_decay_stays_finite(gate, make_inputs, chunk_size):
    inputs = make_inputs((1, 40, 1, 4))
    q, k, v = inputs.queries(), inputs.keys(), inputs.values()
    g = torch.full_like(_gate(inputs, gate), -60.0)  # exp(-cumsum) over a chunk of 16 would overflow float64
    o, state = chunk_decay_linear_attn(q, k, v, g, chunk_size=chunk_size)
    ref_o, ref_state = naive_recurrent_decay_linear_attn(q, k, v, g)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, ref_o)
    torch.testing.assert_close(state, ref_state)


@pytest.mark.parametrize("gate", ["scalar", "vector"])
@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_zero_gate_equals_linear_attn(form, gate, inputs, prequential, chunk_size):
    q, k, v, beta, s0 = inputs.queries(), inputs.keys(), inputs.values(), inputs.beta(), inputs.state()
    g = torch.zeros_like(_gate(inputs, gate))
    if form == "naive":
        got = naive_recurrent_decay_linear_attn(q, k, v, g, beta, s0, prequential)
        want = naive_recurrent_linear_attn(q, k, v, beta, s0, prequential)
    else:
        got = chunk_decay_linear_attn(q, k, v, g, beta, s0, prequential, chunk_size)
        want = chunk_linear_attn(q, k, v, beta, s0, prequential, chunk_size)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("step", [0, 3, 5])
@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_prequential_never_reads_own_value(form, step, make_inputs, check_no_leak, check_own_value):
    inputs = make_inputs((2, LEAK_T, 2, 4))
    tensors = {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.values(), "g": inputs.log_gate(4)}
    fn = (
        naive_recurrent_decay_linear_attn
        if form == "naive"
        else partial(chunk_decay_linear_attn, chunk_size=LEAK_CHUNK)
    )
    check_no_leak(partial(fn, prequential=True), tensors, step)
    check_own_value(partial(fn, prequential=False), tensors, step)
