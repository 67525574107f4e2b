"""Fixtures for every test: a fixed seed and a bounded thread count (a CLI child: one thread); ``one_thread`` for
the tests that ask."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from lightning.pytorch import seed_everything

torch.set_num_threads(min(2, os.cpu_count() or 1))
# A `python -m cl_lightning` child of a test runs one thread unless the test sets its own: the CLI's policy would
# choose the training threads from the load at start, and tests compare runs (a resumed one with an uninterrupted one)
# that must train on the same count. test_threads checks the policy itself, with these variables removed.
os.environ.setdefault("OMP_NUM_THREADS", "1")


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


@pytest.fixture(autouse=True)
def _event_files_sort_in_order() -> None:
    """TensorBoard names an event file ``events.out.tfevents.<second>.<host>.<pid>.<n>`` with ``n`` counting the
    writers of the process, and reads a folder's files in name order. Every test's fits run in this one process, so two
    fits of one test within one second could be read out of order once ``n`` passes 9 (``.10`` sorts before ``.9``;
    seen in CI as steps [47, 15, 31]). A fit run from the command line has a process of its own and ``n`` = 0. Each
    test counts from 0 again, so its files stay below 10 and sort as they were written."""
    from tensorboard.summary.writer import event_file_writer

    event_file_writer._global_uid = event_file_writer.AtomicCounter(0)
