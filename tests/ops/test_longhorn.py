import torch

from cl_lightning.ops import longhorn_step_size
from cl_lightning.ops.delta_rule import chunk_delta_rule
from cl_lightning.ops.longhorn import chunk_longhorn


def test_exact_step_is_proximal_solution(make_inputs):
    # argmin_s ||s - s0||^2 + beta (s^T k - x)^2 = (I + beta k k^T)^{-1} (s0 + beta x k), per value channel.
    inputs = make_inputs((2, 1, 3, 6))
    k, v, s0 = inputs.queries(), inputs.values(), inputs.state()
    beta = 3.0 * inputs.beta()  # (B, H, 1)
    _, state = chunk_delta_rule(k, k, v, longhorn_step_size(beta, k), s0)
    k_t, b_t = k[:, :, 0], beta[:, :, 0, None, None]  # (B, H, K), (B, H, 1, 1)
    lhs = torch.eye(6, dtype=torch.float64) + b_t * k_t.unsqueeze(-1) * k_t.unsqueeze(-2)  # (B, H, K, K)
    rhs = s0 + b_t * k_t.unsqueeze(-1) * v[:, :, 0].unsqueeze(-2)  # (B, H, K, V)
    torch.testing.assert_close(state, torch.linalg.solve(lhs, rhs))


def test_transitions_are_contractive(make_inputs, chunk_size):
    # Large steps and unnormalised keys: 1 - eps k_i^2 stays in (0, 1], so a zero-input state only shrinks.
    inputs = make_inputs((2, 33, 2, 8))
    k = 5.0 * inputs.queries()
    s0 = inputs.state()
    _, state = chunk_longhorn(k, k, torch.zeros_like(inputs.values()), 100.0 * inputs.beta(), s0, chunk_size=chunk_size)
    assert (state.abs() <= s0.abs()).all()
