"""Streaming equivalence: feeding one token at a time (carrying the state) equals one chunked call."""

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch

from cl_lightning.ops import (
    chunk_decay_linear_attn,
    chunk_delta_rule,
    chunk_gated_delta_rule,
    chunk_linear_attn,
    chunk_longhorn,
    chunk_ttt_linear,
)


def _ops(inputs) -> dict[str, tuple[Callable[..., Any], dict[str, torch.Tensor]]]:
    q, k, v, beta = inputs.queries(), inputs.keys(), inputs.values(), inputs.beta()
    return {
        "linear_attn": (chunk_linear_attn, {"q": q, "k": k, "v": v, "beta": beta}),
        "decay": (chunk_decay_linear_attn, {"q": q, "k": k, "v": v, "g": inputs.log_gate(inputs.dim)}),
        "delta_rule": (chunk_delta_rule, {"q": q, "k": k, "v": v, "beta": beta}),
        "gated_delta_rule": (chunk_gated_delta_rule, {"q": q, "k": k, "v": v, "beta": beta, "g": inputs.log_gate()}),
        "longhorn": (chunk_longhorn, {"q": q, "k": q, "v": v, "beta": beta}),
        "ttt_linear": (partial(chunk_ttt_linear, mini_batch_size=1), {"q": q, "k": k, "v": q, "beta": beta}),
    }


@pytest.mark.parametrize("op", ["linear_attn", "decay", "delta_rule", "gated_delta_rule", "longhorn", "ttt_linear"])
def test_one_token_at_a_time_equals_one_call(op, make_inputs, prequential):
    fn, tensors = _ops(make_inputs((2, 9, 2, 4)))[op]
    fn = partial(fn, prequential=prequential)
    want_o, want_state = fn(**tensors)
    state, outputs = None, []
    for t in range(9):
        o, state = fn(**{name: x[:, :, t : t + 1] for name, x in tensors.items()}, initial_state=state)
        outputs.append(o)
    torch.testing.assert_close(torch.cat(outputs, dim=2), want_o)
    torch.testing.assert_close(state, want_state)
