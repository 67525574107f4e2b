import torch

from cl_lightning.ops.ttt_linear import chunk_ttt_linear, layer_norm, ln_l2_grad


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
