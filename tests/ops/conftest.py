"""Shared fixtures for the reference-vs-fast op tests: shape cases, seeded float64 inputs and comparison helpers."""

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import torch
from torch import Tensor

from cl_lightning.ops import l2_normalize

# (B, T, H, D): T = 1, a T not divisible by the chunk size, and several chunks.
SHAPES = [(1, 1, 1, 4), (2, 17, 2, 8), (3, 64, 4, 16)]
CHUNK_SIZE = 16


class RandomInputs:
    """Seeded float64 tensors in (B, H, T, ...) layout; values have V = D + 1 so K/V mix-ups fail."""

    def __init__(self, shape: tuple[int, int, int, int], seed: int = 0) -> None:
        self.batch, self.time, self.heads, self.dim = shape
        self.value_dim = self.dim + 1
        self.gen = torch.Generator().manual_seed(seed)

    def normal(self, *size: int) -> Tensor:
        return torch.randn(*size, generator=self.gen, dtype=torch.float64)

    def per_step(self, *feature: int) -> Tensor:
        return self.normal(self.batch, self.heads, self.time, *feature)

    def queries(self) -> Tensor:
        return self.per_step(self.dim)

    def keys(self) -> Tensor:
        return l2_normalize(self.per_step(self.dim))

    def values(self) -> Tensor:
        return self.per_step(self.value_dim)

    def beta(self, *feature: int) -> Tensor:
        return torch.sigmoid(self.per_step(*feature))

    def log_gate(self, *feature: int) -> Tensor:
        return torch.nn.functional.logsigmoid(self.per_step(*feature) + 2.0)  # g <= 0, mostly near 0

    def state(self) -> Tensor:
        return self.normal(self.batch, self.heads, self.dim, self.value_dim)

    def rule_inputs(self, **overrides: Tensor) -> dict[str, Tensor]:
        """q, k, v, beta and the initial state of a matrix-state rule by argument name, then ``overrides`` (or more)."""
        base = {"q": self.queries(), "k": self.keys(), "v": self.values(), "beta": self.beta()}
        return {**base, **overrides, "initial_state": overrides.get("initial_state", self.state())}

    def mlp_rule_inputs(self, hidden: int = 6) -> dict[str, Tensor]:
        """q, k, v, beta (halved) and the parameters w1, b1, w2, b2 of a TTT-MLP state with ``hidden`` units."""
        b, h, d, v = self.batch, self.heads, self.dim, self.value_dim
        base = {"q": self.queries(), "k": self.keys(), "v": self.values(), "beta": 0.5 * self.beta()}
        layer1 = {"w1": self.normal(b, h, d, hidden), "b1": 0.1 * self.normal(b, h, hidden)}
        return {**base, **layer1, "w2": 0.3 * self.normal(b, h, hidden, v), "b2": 0.1 * self.normal(b, h, v)}


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    """These ops are tiny: intra-op threads only add OpenMP sync cost (100x slower bmm on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=SHAPES, ids=[f"B{b}-T{t}-H{h}-D{d}" for b, t, h, d in SHAPES])
def inputs(request: pytest.FixtureRequest) -> RandomInputs:
    return RandomInputs(request.param)


@pytest.fixture(params=[False, True], ids=["read-after-write", "prequential"])
def prequential(request: pytest.FixtureRequest) -> bool:
    return request.param


@pytest.fixture
def chunk_size() -> int:
    return CHUNK_SIZE


def _flatten(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    return [x for item in out for x in _flatten(item)]


def _forward(fn: Callable[..., Any], tensors: dict[str, Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in tensors.items()}
    return _flatten(fn(**leaves)), list(leaves.values())


def assert_matches_reference(
    reference: Callable[..., Any], fast: Callable[..., Any], tensors: dict[str, Tensor], seed: int = 1
) -> None:
    """Outputs, final state(s) and the gradients of every tensor in ``tensors`` agree (default tolerances)."""
    ref_out, ref_leaves = _forward(reference, tensors)
    fast_out, fast_leaves = _forward(fast, tensors)
    assert len(ref_out) == len(fast_out)
    for i, (ref, got) in enumerate(zip(ref_out, fast_out, strict=True)):
        torch.testing.assert_close(got, ref, msg=lambda m, i=i: f"output {i}: {m}")
    gen = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in ref_out]
    ref_grads = torch.autograd.grad(ref_out, ref_leaves, upstream)
    fast_grads = torch.autograd.grad(fast_out, fast_leaves, upstream)
    for name, ref, got in zip(tensors, ref_grads, fast_grads, strict=True):
        torch.testing.assert_close(got, ref, msg=lambda m, name=name: f"grad of {name}: {m}")


def _perturb(values: Tensor, step: int) -> Tensor:
    """v with v_step moved by a non-constant vector (a constant shift is invisible through TTT's LayerNorm)."""
    values = values.clone()
    values[:, :, step] += torch.linspace(-1.0, 2.0, values.shape[-1], dtype=values.dtype)
    return values


def assert_no_value_leak(fn: Callable[..., Any], tensors: dict[str, Tensor], step: int) -> None:
    """Perturbing v_step leaves o_{<=step} unchanged (prequential) but changes o_{step+1}."""
    base, _ = fn(**tensors)
    values = _perturb(tensors["v"], step)
    perturbed, _ = fn(**{**tensors, "v": values})
    torch.testing.assert_close(perturbed[:, :, : step + 1], base[:, :, : step + 1])
    assert (perturbed[:, :, step + 1] - base[:, :, step + 1]).abs().max() > 1e-3


def assert_value_reaches_own_output(fn: Callable[..., Any], tensors: dict[str, Tensor], step: int) -> None:
    """Read-after-write sanity check: perturbing v_step changes o_step (so the leak check can fail)."""
    base, _ = fn(**tensors)
    values = _perturb(tensors["v"], step)
    perturbed, _ = fn(**{**tensors, "v": values})
    assert (perturbed[:, :, step] - base[:, :, step]).abs().max() > 1e-3


# Helpers reach the test modules as fixtures, which works under every pytest import mode.
@pytest.fixture
def make_inputs() -> type[RandomInputs]:
    return RandomInputs


@pytest.fixture
def check_reference() -> Callable[..., None]:
    return assert_matches_reference


@pytest.fixture
def check_forms(prequential: bool, chunk_size: int) -> Callable[..., None]:
    """``check(reference, chunked, tensors, **options)``: the two forms agree, in this test's reading mode."""

    def check(reference: Callable[..., Any], chunked: Callable[..., Any], tensors: dict[str, Tensor], **options: Any):
        assert_matches_reference(
            partial(reference, prequential=prequential, **options),
            partial(chunked, prequential=prequential, chunk_size=chunk_size, **options),
            tensors,
        )

    return check


@pytest.fixture
def check_no_leak() -> Callable[..., None]:
    return assert_no_value_leak


@pytest.fixture
def check_own_value() -> Callable[..., None]:
    return assert_value_reaches_own_output
