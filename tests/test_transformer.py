from __future__ import annotations

import pytest
import torch

from cl_lightning.nn.transformer import TinyTransformer, naive_attention, support_mask


@pytest.mark.parametrize(("batch", "tokens", "width"), [(1, 1, 4), (2, 17, 8), (3, 64, 16)], ids=lambda v: str(v))
def test_sdpa_equals_manual_outputs_and_gradients(batch: int, tokens: int, width: int) -> None:
    torch.manual_seed(0)
    model = TinyTransformer(width, num_layers=3).double()
    x = torch.randn(batch, tokens, width, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(batch, tokens, width, dtype=torch.float64)
    for num_supports in (None, max(1, tokens // 2)):
        fast = model(x, num_supports=num_supports, fast=True)
        slow = model(x, num_supports=num_supports, fast=False)
        torch.testing.assert_close(fast, slow)
        g_fast = torch.autograd.grad((fast * upstream).sum(), [x, *model.parameters()])
        g_slow = torch.autograd.grad((slow * upstream).sum(), [x, *model.parameters()])
        for a, b in zip(g_fast, g_slow, strict=True):
            torch.testing.assert_close(a, b)


def test_masked_batch_of_queries_equals_each_query_alone() -> None:
    torch.manual_seed(1)
    model = TinyTransformer(6, num_layers=4).double()
    supports, queries = torch.randn(7, 6, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    together = model(torch.cat([supports, queries])[None], num_supports=7)[0, 7:]
    for i in range(5):
        alone = model(torch.cat([supports, queries[i : i + 1]])[None], num_supports=7)[0, 7]
        torch.testing.assert_close(together[i], alone)
    # the supports' outputs do not depend on the queries at all
    torch.testing.assert_close(
        model(torch.cat([supports, queries])[None], num_supports=7)[0, :7], model(supports[None], num_supports=7)[0]
    )


def test_support_mask_by_hand() -> None:
    expected = torch.tensor(
        [
            [1, 1, 0, 0],
            [1, 1, 0, 0],
            [1, 1, 1, 0],
            [1, 1, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(support_mask(2, 4), expected)


def test_one_layer_by_hand() -> None:
    # identity projections, zero biases: z1 = z + softmax(z zᵀ / √d) z
    model = TinyTransformer(2, num_layers=1).double()
    for lin in (model.q[0], model.k[0], model.v[0]):
        torch.nn.init.eye_(lin.weight)
        torch.nn.init.zeros_(lin.bias)
    z = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]], dtype=torch.float64)
    s = torch.tensor([[1.0, 0.0], [0.0, 4.0]], dtype=torch.float64) / 2**0.5
    expected = z[0] + s.softmax(-1) @ z[0]
    torch.testing.assert_close(model(z)[0], expected)
    torch.testing.assert_close(naive_attention(z, z, z), (s.softmax(-1) @ z[0])[None])


def test_xavier_init_and_no_other_parameters() -> None:
    model = TinyTransformer(59, num_layers=10)
    assert sum(p.numel() for p in model.parameters()) == 10 * 3 * (59 * 59 + 59)  # 106,200 with the paper's sizes
    bound = (6 / (59 + 59)) ** 0.5
    assert model.q[0].weight.abs().max() <= bound
    assert model.q[0].weight.abs().max() > 0.9 * bound
    assert torch.count_nonzero(model.v[3].bias) == 0
