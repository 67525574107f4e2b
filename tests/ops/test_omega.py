from functools import partial

import pytest
import torch

from cl_lightning.ops.delta_rule import chunk_delta_rule
from cl_lightning.ops.omega import chunk_omega_rule, naive_recurrent_omega_rule

LEAK_T, LEAK_CHUNK = 8, 4


def _tensors(inputs, window):
    return inputs.rule_inputs(beta=inputs.beta() / window, gamma=inputs.beta())  # eta * sum(gamma) < 1: contractive


@pytest.mark.parametrize("window", [1, 3, 5])
def test_chunk_matches_reference(window, inputs, check_forms):
    check_forms(naive_recurrent_omega_rule, chunk_omega_rule, _tensors(inputs, window), window=window)


@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_window_one_is_the_delta_rule(form, inputs, prequential, chunk_size):
    q, k, v, beta, s0 = inputs.queries(), inputs.keys(), inputs.values(), inputs.beta(), inputs.state()
    fn = naive_recurrent_omega_rule if form == "naive" else partial(chunk_omega_rule, chunk_size=chunk_size)
    got = fn(q, k, v, beta, window=1, initial_state=s0, prequential=prequential)
    want = chunk_delta_rule(q, k, v, beta, s0, prequential=prequential, chunk_size=chunk_size)
    torch.testing.assert_close(got, want)


def test_hand_worked_window_of_two():
    # Orthonormal keys e1, e2; eta = 1/2, gamma = 1. Step 1 writes 1/2 v1 on e1. Step 2's window {1, 2} adds
    # 1/2 (v1 - 1/2 v1) on e1 and 1/2 v2 on e2: S^T e1 = 3/4 v1, S^T e2 = 1/2 v2.
    e = torch.eye(2, dtype=torch.float64).view(1, 1, 2, 2)
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64).view(1, 1, 2, 2)
    beta = torch.full((1, 1, 2), 0.5, dtype=torch.float64)
    _, state = chunk_omega_rule(e, e, v, beta, window=2, chunk_size=1)
    torch.testing.assert_close(state[0, 0], torch.tensor([[0.75, 0.0], [0.0, 1.0]], dtype=torch.float64))


def test_bad_window_raises(make_inputs):
    inputs = make_inputs((1, 3, 1, 4))
    with pytest.raises(ValueError, match="window"):
        chunk_omega_rule(inputs.queries(), inputs.keys(), inputs.values(), inputs.beta(), window=0)


@pytest.mark.parametrize("step", [0, 3, 5])
@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_prequential_never_reads_own_value(form, step, make_inputs, check_no_leak, check_own_value):
    inputs = make_inputs((2, LEAK_T, 2, 4))
    tensors = {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.values(), "beta": inputs.beta() / 3}
    fn = naive_recurrent_omega_rule if form == "naive" else partial(chunk_omega_rule, chunk_size=LEAK_CHUNK)
    fn = partial(fn, window=3)
    check_no_leak(partial(fn, prequential=True), tensors, step)
    check_own_value(partial(fn, prequential=False), tensors, step)
