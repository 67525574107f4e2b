from functools import partial

import pytest

from cl_lightning.ops.linear_attn import chunk_linear_attn, naive_recurrent_linear_attn

LEAK_T, LEAK_CHUNK = 8, 4  # steps 0, 3 (chunk end) and 5 (inside a chunk)


def test_chunk_matches_reference(inputs, check_forms):
    check_forms(naive_recurrent_linear_attn, chunk_linear_attn, inputs.rule_inputs())


def test_chunk_matches_reference_without_beta_and_state(inputs, check_forms):
    check_forms(
        naive_recurrent_linear_attn,
        chunk_linear_attn,
        {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.values()},
    )


@pytest.mark.parametrize("step", [0, 3, 5])
@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_prequential_never_reads_own_value(form, step, make_inputs, check_no_leak, check_own_value):
    inputs = make_inputs((2, LEAK_T, 2, 4))
    tensors = {"q": inputs.queries(), "k": inputs.keys(), "v": inputs.values(), "beta": inputs.beta()}
    fn = naive_recurrent_linear_attn if form == "naive" else partial(chunk_linear_attn, chunk_size=LEAK_CHUNK)
    check_no_leak(partial(fn, prequential=True), tensors, step)
    check_own_value(partial(fn, prequential=False), tensors, step)
