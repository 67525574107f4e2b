from functools import partial

import pytest
import torch

from cl_lightning.ops.ttt_linear import chunk_ttt_linear, layer_norm, ln_l2_grad, naive_recurrent_ttt_linear

LEAK_T, LEAK_MINI_BATCH = 8, 4


def _tensors(inputs):
    heads, dim = inputs.heads, inputs.dim
    return {
        "q": inputs.queries(),
        "k": inputs.keys(),
        "v": inputs.queries(),  # TTT needs V == K
        "beta": 0.5 * inputs.beta(),
        "ln_weight": 1.0 + 0.1 * inputs.normal(heads, dim),
        "ln_bias": 0.1 * inputs.normal(heads, dim),
        "w0": 0.1 * inputs.normal(inputs.batch, heads, dim, dim),
        "b0": 0.1 * inputs.normal(inputs.batch, heads, dim),
    }


def _with_state(fn):
    def run(w0, b0, **kwargs):
        return fn(initial_state=(w0, b0), **kwargs)

    return run


@pytest.mark.parametrize("mini_batch_size", [16, 5])
def test_chunk_matches_reference(mini_batch_size, inputs, prequential, check_reference):
    tensors = _tensors(inputs)
    check_reference(
        _with_state(partial(naive_recurrent_ttt_linear, prequential=prequential, mini_batch_size=mini_batch_size)),
        _with_state(partial(chunk_ttt_linear, prequential=prequential, mini_batch_size=mini_batch_size)),
        tensors,
    )


def test_chunk_matches_reference_with_learned_position_scale(make_inputs, prequential, check_reference):
    inputs = make_inputs((2, 11, 2, 4))
    tensors = {**_tensors(inputs), "position_scale": 1.0 / torch.arange(1.0, 5.0, dtype=torch.float64) + 0.1}
    check_reference(
        _with_state(partial(naive_recurrent_ttt_linear, prequential=prequential, mini_batch_size=4)),
        _with_state(partial(chunk_ttt_linear, prequential=prequential, mini_batch_size=4)),
        tensors,
    )


def test_ln_l2_grad_matches_autograd(make_inputs):
    inputs = make_inputs((2, 5, 3, 6))
    z, target = inputs.queries().requires_grad_(True), inputs.queries()
    weight, bias = 1.0 + inputs.normal(3, 1, 6), inputs.normal(3, 1, 6)
    loss = 0.5 * (layer_norm(z, weight, bias) - target).pow(2).sum()
    (want,) = torch.autograd.grad(loss, z)
    torch.testing.assert_close(ln_l2_grad(z, target, weight, bias), want)


def test_defaults_match_explicit_identity_layer_norm(make_inputs):
    inputs = make_inputs((1, 7, 2, 4))
    q, k, v, beta = inputs.queries(), inputs.keys(), inputs.queries(), inputs.beta()
    ones, zeros = torch.ones(2, 4, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64)
    state = (torch.zeros(1, 2, 4, 4, dtype=torch.float64), torch.zeros(1, 2, 4, dtype=torch.float64))
    torch.testing.assert_close(
        chunk_ttt_linear(q, k, v, beta, mini_batch_size=3),
        chunk_ttt_linear(q, k, v, beta, ones, zeros, state, mini_batch_size=3),
    )


def test_bad_mini_batch_size_raises(make_inputs):
    inputs = make_inputs((1, 3, 1, 4))
    with pytest.raises(ValueError, match="mini_batch_size"):
        chunk_ttt_linear(inputs.queries(), inputs.keys(), inputs.queries(), inputs.beta(), mini_batch_size=0)


@pytest.mark.parametrize("step", [0, 3, 5])
@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_prequential_never_reads_own_value(form, step, make_inputs, check_no_leak, check_own_value):
    inputs = make_inputs((2, LEAK_T, 2, 4))
    tensors = {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.queries(), "beta": inputs.beta()}
    state = (0.3 * inputs.normal(2, 2, 4, 4), 0.3 * inputs.normal(2, 2, 4))  # W = 0 makes LN(k W + b) degenerate
    fn = naive_recurrent_ttt_linear if form == "naive" else chunk_ttt_linear
    fn = partial(fn, initial_state=state, mini_batch_size=LEAK_MINI_BATCH)
    check_no_leak(partial(fn, prequential=True), tensors, step)
    check_own_value(partial(fn, prequential=False), tensors, step)
