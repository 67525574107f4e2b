from functools import partial

import pytest
import torch

from cl_lightning.ops.delta_rule import chunk_delta_rule
from cl_lightning.ops.ttt_mlp import chunk_ttt_mlp, gelu, gelu_grad, mlp_forward, naive_recurrent_ttt_mlp

LEAK_T, LEAK_MINI_BATCH = 8, 4
HIDDEN = 6


def _tensors(inputs):
    b, h, d, v = inputs.batch, inputs.heads, inputs.dim, inputs.value_dim
    return {
        "q": inputs.queries(),
        "k": inputs.keys(),
        "v": inputs.values(),
        "beta": 0.5 * inputs.beta(),
        "w1": inputs.normal(b, h, d, HIDDEN),
        "b1": 0.1 * inputs.normal(b, h, HIDDEN),
        "w2": 0.3 * inputs.normal(b, h, HIDDEN, v),
        "b2": 0.1 * inputs.normal(b, h, v),
    }


def _with_state(fn):
    def run(w1, b1, w2, b2, **kwargs):
        return fn(initial_state=(w1, b1, w2, b2), **kwargs)

    return run


@pytest.mark.parametrize("mini_batch_size", [16, 5, 1])
def test_chunk_matches_reference(mini_batch_size, inputs, prequential, check_reference):
    check_reference(
        _with_state(partial(naive_recurrent_ttt_mlp, prequential=prequential, mini_batch_size=mini_batch_size)),
        _with_state(partial(chunk_ttt_mlp, prequential=prequential, mini_batch_size=mini_batch_size)),
        _tensors(inputs),
    )


def test_chunk_matches_reference_with_position_scale(make_inputs, prequential, check_reference):
    inputs = make_inputs((2, 11, 2, 4))
    tensors = {**_tensors(inputs), "position_scale": 1.0 / torch.arange(1.0, 5.0, dtype=torch.float64)}
    check_reference(
        _with_state(partial(naive_recurrent_ttt_mlp, prequential=prequential, mini_batch_size=4)),
        _with_state(partial(chunk_ttt_mlp, prequential=prequential, mini_batch_size=4)),
        tensors,
    )


def test_gelu_is_torch_tanh_gelu_and_its_grad_is_autograd():
    x = torch.linspace(-4, 4, 101, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(gelu(x), torch.nn.functional.gelu(x, approximate="tanh"))
    (want,) = torch.autograd.grad(gelu(x).sum(), x)
    torch.testing.assert_close(gelu_grad(x), want)


def test_one_step_is_gradient_descent_on_the_regression_loss(make_inputs):
    # One token, rate eta: the new parameters are P_0 - eta grad(1/2 ||f(k) - v||^2), checked with autograd.
    inputs = make_inputs((1, 1, 1, 4))
    t = _tensors(inputs)
    params = [t[n].clone().requires_grad_(True) for n in ("w1", "b1", "w2", "b2")]
    w1, b1, w2, b2 = params
    pred = gelu(t["k"] @ w1 + b1.unsqueeze(2)) @ w2 + b2.unsqueeze(2)
    grads = torch.autograd.grad(0.5 * (pred - t["v"]).pow(2).sum(), params)
    _, state = chunk_ttt_mlp(t["q"], t["k"], t["v"], t["beta"], tuple(p.detach() for p in params))
    for p, g, got in zip(params, grads, state, strict=True):
        torch.testing.assert_close(got, p.detach() - t["beta"][0, 0, 0] * g)


def test_repeated_writes_fit_a_non_linear_map():
    # 8 keys whose targets are the sign of the product of their two coordinates (xor of the signs): 600 passes of
    # mini-batch GD bring the deep memory's worst error to 0.31; the best a linear memory (delta rule, same passes)
    # reaches is above 1, since xor is not linear.
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(1, 1, 8, 2, generator=gen, dtype=torch.float64)
    v = (k[..., :1] * k[..., 1:2]).sign()  # (1, 1, 8, 1)
    state = (
        torch.randn(1, 1, 2, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64),
        torch.zeros(1, 1, 32, dtype=torch.float64),
        torch.zeros(1, 1, 32, 1, dtype=torch.float64),
        torch.zeros(1, 1, 1, dtype=torch.float64),
    )
    kk, vv = k.repeat(1, 1, 600, 1), v.repeat(1, 1, 600, 1)
    _, state = chunk_ttt_mlp(kk, kk, vv, torch.full((1, 1, 4800), 0.005, dtype=torch.float64), state, mini_batch_size=8)
    assert (mlp_forward(k, state) - v).abs().max() < 0.5
    _, linear = chunk_delta_rule(kk, kk, vv, torch.full((1, 1, 4800), 0.05, dtype=torch.float64))
    assert (k @ linear - v).abs().max() > 1.0


@pytest.mark.parametrize("step", [0, 3, 5])
@pytest.mark.parametrize("form", ["naive", "chunk"])
def test_prequential_never_reads_own_value(form, step, make_inputs, check_no_leak, check_own_value):
    inputs = make_inputs((2, LEAK_T, 2, 4))
    t = _tensors(inputs)
    tensors = {n: t[n] for n in ("q", "k", "v", "beta")}
    fn = naive_recurrent_ttt_mlp if form == "naive" else chunk_ttt_mlp
    fn = partial(fn, initial_state=(t["w1"], t["b1"], t["w2"], t["b2"]), mini_batch_size=LEAK_MINI_BATCH)
    check_no_leak(partial(fn, prequential=True), tensors, step)
    check_own_value(partial(fn, prequential=False), tensors, step)
