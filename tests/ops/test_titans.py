from functools import partial

import pytest
import torch

from cl_lightning.ops.delta_rule import chunk_delta_rule
from cl_lightning.ops.titans import chunk_titans_linear, naive_recurrent_titans_linear

LEAK_T, LEAK_MINI_BATCH = 8, 4


def _tensors(inputs):
    return {
        "q": inputs.queries(),
        "k": inputs.keys(),
        "v": inputs.values(),
        "beta": 0.5 * inputs.beta(),
        "log_momentum": inputs.log_gate(),
        "log_retain": inputs.log_gate(),
        "w0": inputs.state(),
        "m0": 0.1 * inputs.state(),
    }


def _with_state(fn):
    def run(w0, m0, **kwargs):
        return fn(initial_state=(w0, m0), **kwargs)

    return run


@pytest.mark.parametrize("mini_batch_size", [16, 5, 1])
def test_chunk_matches_reference(mini_batch_size, inputs, prequential, check_reference):
    check_reference(
        _with_state(partial(naive_recurrent_titans_linear, prequential=prequential, mini_batch_size=mini_batch_size)),
        _with_state(partial(chunk_titans_linear, prequential=prequential, mini_batch_size=mini_batch_size)),
        _tensors(inputs),
    )


@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_no_momentum_no_decay_one_token_batches_is_the_delta_rule(form, inputs, prequential):
    q, k, v, beta, s0 = inputs.queries(), inputs.keys(), inputs.values(), inputs.beta(), inputs.state()
    no_momentum = torch.full_like(beta, -200.0)  # mu = exp(-200): momentum forgets at once
    fn = naive_recurrent_titans_linear if form == "naive" else chunk_titans_linear
    o, (w, _) = fn(q, k, v, beta, no_momentum, None, (s0, torch.zeros_like(s0)), prequential, mini_batch_size=1)
    want_o, want_s = chunk_delta_rule(q, k, v, beta, s0, prequential=prequential)
    torch.testing.assert_close(o, want_o)
    torch.testing.assert_close(w, want_s)


def test_momentum_keeps_moving_after_the_surprise():
    # One key e1, value 1, theta = 1/2, mu = 1/2, no decay, exact gradients. Token 1: U = 1/2, M = 1/2, W = 1/2.
    # Token 2 (same pair): U = 1/2 (1 - 1/2) = 1/4, M = 1/4 + 1/4 = 1/2, W = 1: the momentum carries the first
    # surprise on, where a delta rule with step 1/2 would sit at 3/4.
    e = torch.ones(1, 1, 2, 1, dtype=torch.float64)
    beta = torch.full((1, 1, 2), 0.5, dtype=torch.float64)
    log_mu = torch.full((1, 1, 2), 0.5, dtype=torch.float64).log()
    for fn in (naive_recurrent_titans_linear, chunk_titans_linear):
        o, (w, m) = fn(e, e, e, beta, log_mu, None, mini_batch_size=1)
        torch.testing.assert_close(o.flatten(), torch.tensor([0.5, 1.0], dtype=torch.float64))
        torch.testing.assert_close(m.flatten(), torch.tensor([0.5], dtype=torch.float64))
        torch.testing.assert_close(w.flatten(), torch.tensor([1.0], dtype=torch.float64))


def test_bad_mini_batch_size_raises(make_inputs):
    inputs = make_inputs((1, 3, 1, 4))
    with pytest.raises(ValueError, match="mini_batch_size"):
        chunk_titans_linear(inputs.queries(), inputs.keys(), inputs.values(), inputs.beta(), mini_batch_size=0)


@pytest.mark.parametrize("step", [0, 3, 5])
@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_prequential_never_reads_own_value(form, step, make_inputs, check_no_leak, check_own_value):
    inputs = make_inputs((2, LEAK_T, 2, 4))
    tensors = {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.values(), "beta": inputs.beta()}
    fn = naive_recurrent_titans_linear if form == "naive" else chunk_titans_linear
    fn = partial(fn, log_momentum=inputs.log_gate(), mini_batch_size=LEAK_MINI_BATCH)
    check_no_leak(partial(fn, prequential=True), tensors, step)
    check_own_value(partial(fn, prequential=False), tensors, step)
