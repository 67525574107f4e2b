"""The heap helpers give freed tensor memory back to the operating system (glibc only)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cl_lightning.heap import release_free_heap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc, /proc/self/status")

# A fresh process: 20 tensors of 8 MB, each followed by a small long-lived one (so the big ones are not at the heap's
# top), after one freed 16 MB tensor (which raises glibc's dynamic mmap threshold to 16 MB). Prints the anonymous
# memory still resident after the big ones die, in MB.
RETAINED = """
import torch
from cl_lightning.heap import fix_mmap_threshold
def anon():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon")) / 1024
if {fix}:
    assert fix_mmap_threshold()
torch.ones(4 << 20).sum()
before, big, small = anon(), [], []
for _ in range(20):
    big.append(torch.ones(2 << 20))
    small.append(torch.ones(1024))
del big
print(anon() - before)
"""


def _anon_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon")) / 1024


def _retained_mb(fix: bool) -> float:
    out = subprocess.run([sys.executable, "-c", RETAINED.format(fix=fix)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def test_a_fixed_mmap_threshold_unmaps_large_tensors_when_they_die() -> None:
    if not release_free_heap():
        pytest.skip("not glibc")
    assert _retained_mb(fix=False) > 100  # the dynamic threshold: 160 MB of dead tensors stay resident
    assert _retained_mb(fix=True) < 20


def test_freed_small_tensors_leave_the_heap_after_release() -> None:
    if not release_free_heap():
        pytest.skip("not glibc")
    before = _anon_mb()
    blocks = [torch.ones(256 * 1024) for _ in range(200)]  # 200 × 1 MB, below the mmap threshold: heap blocks
    keep = [torch.ones(1024) for _ in range(10)]  # allocated last, so the freed blocks are not only the heap's top
    assert _anon_mb() - before > 150
    del blocks
    release_free_heap()
    assert _anon_mb() - before < 30
    del keep
