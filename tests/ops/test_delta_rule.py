from functools import partial

import pytest
import torch

from cl_lightning.ops import l2_normalize
from cl_lightning.ops.delta_rule import chunk_delta_rule, naive_recurrent_delta_rule
from cl_lightning.ops.linear_attn import chunk_linear_attn


@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_unit_beta_recalls_last_written_value(form, inputs, chunk_size):
    # With ||k_t|| = 1 and beta = 1 the write is exact: S_t^T k_t = v_t, whatever the earlier state.
    k = l2_normalize(inputs.queries(), eps=0.0)
    v, beta = inputs.values(), torch.ones(inputs.batch, inputs.heads, inputs.time, dtype=torch.float64)
    fn = naive_recurrent_delta_rule if form == "naive" else partial(chunk_delta_rule, chunk_size=chunk_size)
    o, _ = fn(k, k, v, beta, inputs.state())
    torch.testing.assert_close(o, v)


def test_rewritten_key_returns_latest_value(make_inputs, chunk_size):
    inputs = make_inputs((2, 1, 2, 8))
    keys = torch.linalg.qr(inputs.normal(2, 2, 8, 8))[0].transpose(-1, -2)  # orthonormal rows, (B, H, 8, 8)
    first, second = inputs.normal(2, 2, 8, 9), inputs.normal(2, 2, 3, 9)
    k = torch.cat([keys, keys[:, :, :3]], dim=2)  # write 8 pairs, then overwrite the first 3 keys
    v = torch.cat([first, second], dim=2)
    beta = torch.ones(2, 2, 11, dtype=torch.float64)
    want = torch.cat([second, first[:, :, 3:]], dim=2)
    _, state = chunk_delta_rule(k, k, v, beta, chunk_size=chunk_size)
    torch.testing.assert_close(keys @ state, want)
    _, hebbian = chunk_linear_attn(k, k, v, chunk_size=chunk_size)  # linear attention adds instead of replacing
    assert not torch.allclose(keys @ hebbian, want)
