from __future__ import annotations

import torch

from cl_lightning.nn import MLP, PairScorer


def test_factorised_scorer_equals_concatenated_reference() -> None:
    torch.manual_seed(0)
    scorer = PairScorer(x_dim=49, num_labels=10, hidden=100, num_hidden_layers=9).double()
    assert scorer.first.in_features == 108
    assert sum(p.numel() for p in scorer.parameters()) == 101_901
    qx, sx = torch.rand(7, 49, dtype=torch.float64), torch.rand(13, 49, dtype=torch.float64)
    sy = torch.randint(0, 10, (13,))
    fast = scorer(qx, sx, sy)
    ref = scorer.forward_concat(qx, sx, sy)
    assert fast.shape == (7, 13)
    torch.testing.assert_close(fast, ref)
    scorer.pair_budget = 13 * 2  # queries in chunks of 2: same numbers
    torch.testing.assert_close(scorer(qx, sx, sy), ref)
    g_fast = torch.autograd.grad(fast.sum(), list(scorer.parameters()))
    g_ref = torch.autograd.grad(scorer.forward_concat(qx, sx, sy).sum(), list(scorer.parameters()))
    for a, b in zip(g_fast, g_ref, strict=False):
        torch.testing.assert_close(a, b)


def test_label_free_scorer_matches_reference() -> None:
    scorer = PairScorer(x_dim=20, num_labels=0, hidden=20, num_hidden_layers=0).double()
    assert sum(p.numel() for p in scorer.parameters()) == 841  # the paper's SCR scorer 40 -> 20 -> 1
    qx, sx = torch.rand(3, 20, dtype=torch.float64), torch.rand(5, 20, dtype=torch.float64)
    torch.testing.assert_close(scorer(qx, sx), scorer.forward_concat(qx, sx))


def test_scorer_init_is_xavier_with_zero_bias() -> None:
    scorer = PairScorer(x_dim=49, num_labels=10)
    bound = (6 / (108 + 100)) ** 0.5
    assert scorer.first.weight.abs().max() <= bound
    assert scorer.first.bias.abs().max() == 0
    assert scorer.first.weight.abs().max() > 0.9 * bound


def test_mlp_shapes_and_kaiming_init() -> None:
    net = MLP(49, 10, [200, 200, 200, 200])
    assert [layer.out_features for layer in net.layers] == [200, 200, 200, 200, 10]
    assert net(torch.rand(5, 49)).shape == (5, 10)
    bound = (6 / 49) ** 0.5  # kaiming uniform, relu gain: sqrt(6 / fan_in)
    assert net.layers[0].weight.abs().max() <= bound
    assert net.layers[0].bias.abs().max() == 0
