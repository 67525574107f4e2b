import pytest
import torch

from cl_lightning.ops.delta_rule import chunk_delta_rule
from cl_lightning.ops.gated_delta_rule import chunk_gated_delta_rule
from cl_lightning.ops.utils import expand_pairs, pair_outputs


def _naive_multi_pair_delta_rule(q, k, v, beta, state):
    """Per token: read with every query (mean of the P readings) from the state before it, then P delta writes."""
    outputs = []
    for t in range(q.shape[2]):
        outputs.append(torch.einsum("bhpk,bhkv->bhv", q[:, :, t], state) / q.shape[3])
        for p in range(k.shape[3]):
            k_tp = k[:, :, t, p]
            error = v[:, :, t, p] - torch.einsum("bhk,bhkv->bhv", k_tp, state)
            state = state + beta[:, :, t, p, None, None] * k_tp.unsqueeze(-1) * error.unsqueeze(-2)
    return torch.stack(outputs, dim=2), state


@pytest.mark.parametrize("pairs", [1, 3])
def test_expanded_sequence_is_token_by_token_multi_pair_writes(pairs, make_inputs, check_reference):
    inputs = make_inputs((2, 13, 2, 6))
    tensors = {
        "q": inputs.normal(2, 2, 13, pairs, 6),
        "k": torch.nn.functional.normalize(inputs.normal(2, 2, 13, pairs, 6), dim=-1),
        "v": inputs.normal(2, 2, 13, pairs, 7),
        "beta": torch.sigmoid(inputs.normal(2, 2, 13, pairs)),
        "state": inputs.normal(2, 2, 6, 7),
    }

    def expanded(q, k, v, beta, state):
        o, s = chunk_delta_rule(*expand_pairs(q, k, v, beta), state, prequential=True, chunk_size=5)
        return pair_outputs(o, pairs), s

    check_reference(_naive_multi_pair_delta_rule, expanded, tensors)


def test_a_token_never_reads_its_own_pairs(make_inputs):
    inputs = make_inputs((1, 6, 1, 4))
    q, k, v = inputs.normal(1, 1, 6, 2, 4), inputs.normal(1, 1, 6, 2, 4), inputs.normal(1, 1, 6, 2, 5)
    beta, g = torch.full((1, 1, 6, 2), 0.5, dtype=torch.float64), torch.full((1, 1, 12), -0.1, dtype=torch.float64)
    base = pair_outputs(chunk_gated_delta_rule(*expand_pairs(q, k, v, beta), g, prequential=True)[0], 2)
    v2 = v.clone()
    v2[:, :, 3, 1] += 1.0  # token 3's second pair
    got = pair_outputs(chunk_gated_delta_rule(*expand_pairs(q, k, v2, beta), g, prequential=True)[0], 2)
    torch.testing.assert_close(got[:, :, :4], base[:, :, :4])
    assert (got[:, :, 4] - base[:, :, 4]).abs().max() > 1e-3
