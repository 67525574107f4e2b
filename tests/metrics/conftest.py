"""Metric tests use tiny tensors: run them single-threaded (intra-op threads only add barrier waits on a busy CPU)."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
