import pytest
import torch

from cl_lightning.ops import chunk_delta_rule, l2_normalize


def test_l2_normalize_gives_unit_rows(make_inputs):
    x = make_inputs((2, 5, 3, 7)).queries()
    norms = l2_normalize(x, eps=0.0).norm(dim=-1)
    torch.testing.assert_close(norms, torch.ones_like(norms))


def test_l2_normalize_keeps_zero_rows_finite():
    assert torch.equal(l2_normalize(torch.zeros(2, 3)), torch.zeros(2, 3))


def test_bad_chunk_size_raises(make_inputs):
    inputs = make_inputs((1, 3, 1, 4))
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_delta_rule(inputs.queries(), inputs.keys(), inputs.values(), inputs.beta(), chunk_size=0)


def test_float32_in_float32_out(make_inputs):
    inputs = make_inputs((1, 5, 1, 4))
    q, k, v, beta = (x.float() for x in (inputs.queries(), inputs.keys(), inputs.values(), inputs.beta()))
    o, state = chunk_delta_rule(q, k, v, beta, chunk_size=2)
    assert o.dtype == state.dtype == torch.float32
