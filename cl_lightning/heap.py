"""Handing freed heap memory back to the operating system (glibc), so a long run's resident size tracks its tensors.

glibc's ``malloc`` maps blocks above its mmap threshold and returns them on ``free``; below it, blocks come from the
heap, whose free space stays resident. The threshold rises to each freed mapping's size (up to 32 MB), so after a
monitor's one-off pass of large tensors, later ones of that size stay resident after they die. Hence
:func:`fix_mmap_threshold` (the CLI calls it once: a fixed 4 MB, small tensors keep the heap's reuse) and
:func:`release_free_heap` (after a monitor's pass). Neither changes a number; without glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

_M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 4 << 20  # bytes


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of ``nbytes`` or more by its own mapping from now on (glibc ``mallopt``; this also
    stops the threshold from drifting up). ``True`` if it was set."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, nbytes))


def release_free_heap() -> bool:
    """Return the heap's free pages to the operating system (glibc ``malloc_trim(0)``); ``True`` if it ran."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    return libc is not None
