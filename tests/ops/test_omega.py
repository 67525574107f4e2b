import torch

from cl_lightning.ops.omega import chunk_omega_rule


def test_hand_worked_window_of_two():
    # Orthonormal keys e1, e2; eta = 1/2, gamma = 1. Step 1 writes 1/2 v1 on e1. Step 2's window {1, 2} adds
    # 1/2 (v1 - 1/2 v1) on e1 and 1/2 v2 on e2: S^T e1 = 3/4 v1, S^T e2 = 1/2 v2.
    e = torch.eye(2, dtype=torch.float64).view(1, 1, 2, 2)
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64).view(1, 1, 2, 2)
    beta = torch.full((1, 1, 2), 0.5, dtype=torch.float64)
    _, state = chunk_omega_rule(e, e, v, beta, window=2, chunk_size=1)
    torch.testing.assert_close(state[0, 0], torch.tensor([[0.75, 0.0], [0.0, 1.0]], dtype=torch.float64))
