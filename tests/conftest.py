"""Fixtures for every test: a fixed seed and a bounded thread count."""

from __future__ import annotations

import os

import pytest
import torch
from lightning.pytorch import seed_everything

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed() -> None:
    seed_everything(0, workers=True, verbose=False)
