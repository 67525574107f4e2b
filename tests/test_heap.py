"""The heap helpers give freed tensor memory back to the operating system (glibc only)."""

from __future__ import annotations

import subprocess
import sys
from itertools import pairwise

import pytest
import torch

from cl_lightning.callbacks.plasticity import StridedRows
from cl_lightning.heap import release_free_heap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc, /proc/self/status")

# A fresh process: after one freed 16 MB tensor (with glibc's dynamic threshold this raises the mmap threshold to
# 16 MB), how many bytes of one new 8 MB tensor live in mmapped blocks (glibc ``mallinfo2().hblkhd``): those pages
# are returned to the OS the moment the tensor dies, heap pages are not.
MAPPED = """
import ctypes
import torch
from cl_lightning.heap import fix_mmap_threshold

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
                "fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
if {fix}:
    assert fix_mmap_threshold()
torch.ones(4 << 20).sum()
before = libc.mallinfo2().hblkhd
x = torch.ones(2 << 20)
print((libc.mallinfo2().hblkhd - before) / 2**20)
"""


def _anon_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon")) / 1024


def _mapped_mb(fix: bool) -> float:
    out = subprocess.run([sys.executable, "-c", MAPPED.format(fix=fix)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def test_a_fixed_mmap_threshold_maps_large_tensors() -> None:
    if not release_free_heap():
        pytest.skip("not glibc")
    assert _mapped_mb(fix=False) == 0  # the dynamic threshold: the 8 MB tensor sits on the heap
    assert _mapped_mb(fix=True) >= 8  # fixed at 4 MB: its own mapping, unmapped when it dies


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


def _strided_rows_reference(blocks: list[torch.Tensor], max_rows: int) -> torch.Tensor:
    """The first StridedRows: a list of per-block copies, concatenated and halved when over 2 · max_rows."""
    kept: list[torch.Tensor] = []
    stride, seen, count = 1, 0, 0
    for block in blocks:
        first = (-seen) % stride
        seen += block.shape[0]
        part = block[first::stride]
        if part.shape[0]:
            kept.append(part.clone())
            count += part.shape[0]
        while count > 2 * max_rows:
            rows = torch.cat(kept)[::2].clone()
            kept, count, stride = [rows], rows.shape[0], stride * 2
    rows = torch.cat(kept)
    if rows.shape[0] > max_rows:
        rows = rows[torch.linspace(0, rows.shape[0] - 1, max_rows).long()]
    return rows


def test_strided_rows_in_one_buffer_keep_the_rows_of_the_list_version() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        max_rows = int(torch.randint(1, 70, (1,), generator=gen))
        total = int(torch.randint(1, 3000, (1,), generator=gen))
        data, biggest = torch.randn(total, 5, generator=gen), int(torch.randint(1, 400, (1,), generator=gen))
        cuts = torch.randint(1, biggest + 1, (total,), generator=gen).cumsum(0)
        edges = [0, *[int(c) for c in cuts if c < total], total]
        blocks = [data[lo:hi] for lo, hi in pairwise(edges)]
        sampler = StridedRows(max_rows)
        for block in blocks:
            sampler.add(block)
            assert sampler.count <= 2 * max_rows
        assert torch.equal(sampler.rows(), _strided_rows_reference(blocks, max_rows))
