import torch

from cl_lightning.ops.delta_rule import chunk_delta_rule
from cl_lightning.ops.ttt_mlp import chunk_ttt_mlp, gelu, gelu_grad, mlp_forward


def test_gelu_is_torch_tanh_gelu_and_its_grad_is_autograd():
    x = torch.linspace(-4, 4, 101, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(gelu(x), torch.nn.functional.gelu(x, approximate="tanh"))
    (want,) = torch.autograd.grad(gelu(x).sum(), x)
    torch.testing.assert_close(gelu_grad(x), want)


def test_one_step_is_gradient_descent_on_the_regression_loss(make_inputs):
    # One token, rate eta: the new parameters are P_0 - eta grad(1/2 ||f(k) - v||^2), checked with autograd.
    inputs = make_inputs((1, 1, 1, 4))
    t = inputs.mlp_rule_inputs()
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
