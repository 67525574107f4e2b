"""Metric tests use tiny tensors: run them single-threaded (intra-op threads only add barrier waits on a busy CPU)."""

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor, nn
from torch.nn.functional import cross_entropy

from cl_lightning.metrics import flat_loss

TanhMLPLoss = tuple[nn.Module, Callable[[Tensor], Tensor], Tensor]


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def tanh_mlp_loss(widths: tuple[int, int, int, int], points: int) -> TanhMLPLoss:
    """A seeded float64 tanh MLP of the given widths, its flat cross-entropy loss on ``points`` fixed points, theta."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    d_in, h1, h2, d_out = widths
    net = nn.Sequential(nn.Linear(d_in, h1), nn.Tanh(), nn.Linear(h1, h2), nn.Tanh(), nn.Linear(h2, d_out)).double()
    x = torch.randn(points, d_in, generator=gen, dtype=torch.float64)
    y = torch.randint(0, d_out, (points,), generator=gen)
    loss_fn, theta = flat_loss(net, cross_entropy, x, y)
    return net, loss_fn, theta


# Helpers reach the test modules as fixtures, which works under every pytest import mode.
@pytest.fixture(scope="session")
def make_mlp_loss() -> Callable[[tuple[int, int, int, int], int], TanhMLPLoss]:
    return tanh_mlp_loss
