import torch

from cl_lightning.ops.titans import chunk_titans_linear, naive_recurrent_titans_linear


def test_momentum_keeps_moving_after_the_surprise():
    # One key e1, value 1, theta = 1/2, mu = 1/2, no decay, exact gradients. Token 1: U = 1/2, M = 1/2, W = 1/2.
    # Token 2 (same pair): U = 1/2 (1 - 1/2) = 1/4, M = 1/4 + 1/4 = 1/2, W = 1: the momentum carries the first
    # surprise on, where a delta rule with step 1/2 would sit at 3/4.
    e = torch.ones(1, 1, 2, 1, dtype=torch.float64)
    beta = torch.full((1, 1, 2), 0.5, dtype=torch.float64)
    log_mu = torch.full((1, 1, 2), 0.5, dtype=torch.float64).log()
    for fn in (naive_recurrent_titans_linear, chunk_titans_linear):
        o, (w, m) = fn(e, e, e, beta, log_mu, None, mini_batch_size=1)
        torch.testing.assert_close(o.flatten(), torch.tensor([0.5, 1.0], dtype=torch.float64))
        torch.testing.assert_close(m.flatten(), torch.tensor([0.5], dtype=torch.float64))
        torch.testing.assert_close(w.flatten(), torch.tensor([1.0], dtype=torch.float64))
