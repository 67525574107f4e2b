"""Fixtures for every test: a fixed seed and a bounded thread count; ``one_thread`` for the tests that ask."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from lightning.pytorch import seed_everything

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed() -> None:
    seed_everything(0, workers=True, verbose=False)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread, restored afterwards: tiny tensors and one-point steps are latency-bound, and on a shared
    2-core machine two OpenMP threads spin-wait on each other (measured: 2 demo-regime tasks in 5 minutes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
