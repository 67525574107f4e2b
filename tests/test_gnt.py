from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from cl_lightning.nn import AdamGnT, GenerateAndTest
from cl_lightning.nn.gnt import adaptable_contribution, batch_mean, contribution
from cl_lightning.nn.optim.flat_adam import scalar_operand

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- AdamGnT


def test_corrected_adam_gnt_equals_torch_adam() -> None:
    torch.manual_seed(0)
    a = nn.Linear(5, 3).double()
    b = nn.Linear(5, 3).double()
    b.load_state_dict(a.state_dict())
    opt_a = AdamGnT(a.parameters(), lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    opt_b = torch.optim.Adam(b.parameters(), lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    for _ in range(6):
        x = torch.randn(4, 5, dtype=torch.float64)
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def test_reference_rule_is_the_snapshot_update() -> None:
    # one weight, gradients 2 then -1; lr 0.1, β = (0.5, 0.75), ε = 0
    w = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = AdamGnT([w], lr=0.1, betas=(0.5, 0.75), eps=0.0, update_rule="reference")
    w.grad = torch.tensor([2.0], dtype=torch.float64)
    opt.step()  # m = 1, v = 1, t = 1: w -= 0.1 · (1 − 0.75) · 1/1
    torch.testing.assert_close(w.detach(), torch.tensor([1.0 - 0.025], dtype=torch.float64))
    w.grad = torch.tensor([-1.0], dtype=torch.float64)
    opt.step()  # m = 0.5 − 0.5 = 0, so no move whatever v
    torch.testing.assert_close(w.detach(), torch.tensor([0.975], dtype=torch.float64))
    w.grad = torch.tensor([-1.0], dtype=torch.float64)
    opt.step()  # m = -0.5, v = 0.75·(0.75 + 0.25) + 0.25 = 1, t = 3: w -= 0.1 · (1 − 0.75³) · (−0.5)
    torch.testing.assert_close(w.detach(), torch.tensor([0.975 + 0.1 * (1 - 0.75**3) * 0.5], dtype=torch.float64))


def test_reset_rows_restart_with_a_fresh_adam_step() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(3, 4).double()
    opt = AdamGnT(layer.parameters(), lr=0.1)
    assert torch.equal(opt.state[layer.weight]["element_step"], torch.zeros(4, 3, dtype=torch.float64))  # eager
    for _ in range(3):
        layer.weight.grad = torch.randn(4, 3, dtype=torch.float64)
        layer.bias.grad = torch.randn(4, dtype=torch.float64)
        opt.step()
    opt.reset_state(layer.weight, torch.tensor([1, 3]), dim=0)
    state = opt.state[layer.weight]
    assert torch.equal(state["element_step"][:, 0], torch.tensor([3.0, 0.0, 3.0, 0.0], dtype=torch.float64))
    assert state["exp_avg"][[1, 3]].abs().sum() == 0
    assert state["exp_avg_sq"][[1, 3]].abs().sum() == 0
    assert state["exp_avg"][[0, 2]].abs().min() > 0
    before = layer.weight.detach().clone()
    grad = torch.randn(4, 3, dtype=torch.float64)
    layer.weight.grad = grad
    opt.step()
    # a fresh Adam step moves by lr · g / (|g| + ε), i.e. lr · sign(g)
    torch.testing.assert_close(before[[1, 3]] - layer.weight.detach()[[1, 3]], 0.1 * grad[[1, 3]].sign())


# ---------------------------------------------------------------- utilities and running averages


def test_utilities_on_a_hand_worked_case() -> None:
    h = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    h_hat, out_mag, in_mag = torch.tensor([1.0, 1.0]), torch.tensor([2.0, 1.0]), torch.tensor([0.5, 4.0])
    # mean|h| = [2, 1]; mean|h − ĥ| = [(0 + 2)/2, (1 + 1)/2] = [1, 1]
    torch.testing.assert_close(contribution(h, h_hat, out_mag, in_mag), torch.tensor([4.0, 1.0]))
    torch.testing.assert_close(adaptable_contribution(h, h_hat, out_mag, in_mag), torch.tensor([4.0, 0.25]))


def _layers(widths: list[int], seed: int = 0) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(a, b) for a, b in itertools.pairwise(widths)]


def test_running_utility_matches_the_reference_recursion() -> None:
    layers = _layers([3, 2, 2])
    gnt = GenerateAndTest([2], replacement_rate=0.5, maturity_threshold=10, decay_rate=0.9)
    eta, util, mean_act = 0.9, [0.0, 0.0], [0.0, 0.0]
    out_mag = layers[1].weight.detach().abs().mean(0).tolist()
    in_mag = layers[0].weight.detach().abs().mean(1).tolist()
    gen = torch.Generator().manual_seed(0)
    for age in range(1, 5):
        h = torch.rand(4, 2)
        gnt.step(layers, [h], None, gen)
        bc = 1 - eta**age
        for u in range(2):  # lop/algos/gnt.py update_utility, one unit at a time
            col = h[:, u].tolist()
            mean_act[u] = eta * mean_act[u] + (1 - eta) * sum(col) / 4
            h_hat = mean_act[u] / bc
            new = out_mag[u] * sum(abs(v - h_hat) for v in col) / 4 / in_mag[u]
            util[u] = eta * util[u] + (1 - eta) * new
        torch.testing.assert_close(gnt.buffer("util", 0), torch.tensor(util))
        torch.testing.assert_close(gnt.buffer("mean_act", 0), torch.tensor(mean_act))
        torch.testing.assert_close(gnt.buffer("bias_corrected_util", 0), torch.tensor(util) / bc)
    assert gnt.buffer("age", 0).tolist() == [4, 4]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cheaper_forms_compute_what_torch_computes_bit_for_bit(dtype: torch.dtype) -> None:
    """``batch_mean`` (a one-row sum) is ``mean(0)``, and ``scalar_operand``'s 0-d tensors give what Python numbers
    give, on sizes with and without a scalar tail, special values included (-0 made +0 by the mean, NaN, inf)."""
    special = torch.tensor([-0.0, 0.0, float("nan"), float("inf"), -float("inf"), 1e-45, -3.0], dtype=dtype)
    for rows, width in itertools.product((1, 3), (1, 7, 40, 803)):
        x = torch.cat([special, torch.randn(rows * width, dtype=dtype)])[: rows * width].view(rows, width)
        assert torch.equal(_bits(batch_mean(x)), _bits(x.mean(0)))
    t = torch.randint(0, 100_000, (803,)).to(dtype)  # step counts, ages
    x, y = torch.randn(803, dtype=dtype), torch.rand(803, dtype=dtype)
    for n in (1, 7, 40, 803):
        for value in (0.9, 0.99, 0.999, 1e-8):
            c = scalar_operand(value, x)
            assert isinstance(c, torch.Tensor)
            for with_number, with_operand in [
                (torch.pow(value, t[:n]), torch.pow(c, t[:n])),
                (x[:n].mul(value), x[:n].mul(c)),
                (x[:n].add(value), x[:n].add(c)),
                (1 - y[:n], torch.sub(scalar_operand(1.0, x), y[:n])),
            ]:
                assert torch.equal(_bits(with_number), _bits(with_operand))
    assert scalar_operand(0.5, x.bfloat16()) == 0.5  # other dtypes keep the number


# ---------------------------------------------------------------- the hand-built replacement case


def test_replaces_the_lowest_utility_mature_units() -> None:
    hidden, out = nn.Linear(2, 4), nn.Linear(4, 3)
    opt = AdamGnT([*hidden.parameters(), *out.parameters()], lr=0.01)
    for p in (*hidden.parameters(), *out.parameters()):
        p.grad = torch.ones_like(p)
    opt.step()  # every state entry is now non-zero
    with torch.no_grad():
        hidden.bias.fill_(0.5)
        out.weight.copy_(torch.tensor([[1.0, -1.0, 1.0, 1.0], [-1.0, 1.0, 1.0, -1.0], [1.0, 1.0, -1.0, 1.0]]))
    # decay 0 and |outgoing| = 1: utility = mean|h| = [3, 1, 0, 2]. Unit 2 has the lowest but is immature.
    gnt = GenerateAndTest([4], replacement_rate=0.5, maturity_threshold=100, decay_rate=0.0, utility="contribution")
    gnt.buffer("age", 0).copy_(torch.tensor([200, 200, 5, 200]))
    gnt.sync_host()  # ages written by hand: the host's eligible count follows
    h = torch.tensor([[3.0, 1.0, 0.0, 2.0], [3.0, 1.0, 0.0, 2.0]])
    w_in, w_out = hidden.weight.detach().clone(), out.weight.detach().clone()
    gen = torch.Generator().manual_seed(0)

    # 3 eligible × 0.5 = 1.5: replace 1 (unit 1), carry 0.5
    assert [r.tolist() for r in gnt.step([hidden, out], [h], opt, gen)] == [[1]]
    assert gnt.buffer("to_replace", 0).item() == 0.5
    assert gnt.buffer("age", 0).tolist() == [201, 0, 6, 201]
    assert gnt.buffer("util", 0).tolist() == [3.0, 0.0, 0.0, 2.0]
    assert gnt.buffer("mean_act", 0)[1] == 0
    assert torch.equal(out.weight[:, 1], torch.zeros(3))  # outgoing zeroed
    assert torch.equal(out.weight[:, [0, 2, 3]], w_out[:, [0, 2, 3]])
    assert not torch.equal(hidden.weight[1], w_in[1])  # incoming redrawn from U(−b, b), b = √2·√(3/2)
    assert hidden.weight[1].abs().max() <= math.sqrt(2) * math.sqrt(3 / 2)
    assert torch.equal(hidden.weight[[0, 2, 3]], w_in[[0, 2, 3]])
    assert hidden.bias.tolist() == [0.5, 0.0, 0.5, 0.5]
    for param, index in ((hidden.weight, (1, slice(None))), (hidden.bias, 1), (out.weight, (slice(None), 1))):
        for key in ("element_step", "exp_avg", "exp_avg_sq"):
            assert opt.state[param][key][index].abs().sum() == 0, key
    assert opt.state[out.weight]["element_step"][:, 0].tolist() == [1.0, 1.0, 1.0]
    assert opt.state[out.bias]["element_step"].tolist() == [1.0, 1.0, 1.0]  # the next layer's bias is not per unit

    # eligible now {0, 3} (unit 1 is 1 step old, unit 2 is 6): 0.5 + 2 × 0.5 = 1.5 → unit 3 (utility 2 < 3)
    assert [r.tolist() for r in gnt.step([hidden, out], [h], opt, gen)] == [[3]]
    assert gnt.buffer("replaced", 0).item() == 2


@pytest.mark.parametrize("correct", [False, True])
def test_next_bias_correction_option(correct: bool) -> None:
    hidden, out = _layers([3, 5, 2], seed=1)
    gnt = GenerateAndTest([5], replacement_rate=0.2, maturity_threshold=0, decay_rate=0.0, next_bias_correction=correct)
    x = torch.rand(1, 3)
    with torch.no_grad():
        h = hidden(x).relu()
        before = out(h)
        bias = out.bias.clone()
        (index,) = gnt.step([hidden, out], [h], None, torch.Generator().manual_seed(0))
        assert index.numel() == 1
        after = out(hidden(x).relu())
    if correct:  # decay 0: ĥ = h, so the correction keeps the output of this input unchanged
        torch.testing.assert_close(after, before)
    else:  # faithful: the reference reads the mean activation after zeroing it and adds nothing
        assert torch.equal(out.bias, bias)
        assert not torch.allclose(after, before)


# ---------------------------------------------------------------- rates and maturity over many steps


@pytest.mark.parametrize("accumulate", [True, False])
def test_replacement_count_and_maturity(accumulate: bool) -> None:
    # 0.015 × 50 eligible = 0.75 < 1 per step: without accumulation each step replaces one unit with that chance
    rate, maturity, steps, widths = 0.015, 10, 200, [8, 50, 50, 3]
    layers = _layers(widths)
    gnt = GenerateAndTest(widths[1:-1], replacement_rate=rate, maturity_threshold=maturity, accumulate=accumulate)
    expected = [0.0, 0.0]
    x = torch.rand(steps, 16, 8)
    for step in range(steps):
        ages = [gnt.buffer("age", i).clone() for i in range(2)]
        with torch.no_grad():
            h1 = layers[0](x[step]).relu()
            h2 = layers[1](h1).relu()
        replaced = gnt.step(layers, [h1, h2], None, torch.Generator().manual_seed(step))
        for i in range(2):
            expected[i] += rate * int((ages[i] + 1 > maturity).sum())
            assert (ages[i][replaced[i]] + 1 > maturity).all()  # never a unit younger than the threshold
    counts = [int(gnt.buffer("replaced", i)) for i in range(2)]
    if accumulate:  # deterministic: the integer part of the accumulated expectation
        assert counts == [math.floor(e + 1e-9) for e in expected]
    else:  # Bernoulli(0.75-ish) per step: std ≈ 6
        for c, e in zip(counts, expected, strict=True):
            assert abs(c - e) < 4 * math.sqrt(e / 4)
    # ≈ replacement_rate × units × steps, less the steps before maturity and the few units still maturing
    rough = rate * 50 * (steps - maturity)
    assert all(0.8 * rough < c <= rough for c in counts), (counts, rough)


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="hidden layer"):
        GenerateAndTest([])
    with pytest.raises(ValueError, match="replacement_rate"):
        GenerateAndTest([4], replacement_rate=2.0)
    with pytest.raises(ValueError, match="update_rule"):
        AdamGnT([nn.Parameter(torch.zeros(1))], update_rule="buggy")  # type: ignore[arg-type]
