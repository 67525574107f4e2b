"""Handing freed heap memory back to the operating system after a large transient allocation.

glibc's ``malloc`` keeps freed blocks below its (dynamic, up to 32 MB) mmap threshold in the process heap for
reuse, so after a monitor's one-off pass (the Hessian's forward-over-reverse products over a 100 × 1,000 episode
allocate ~200 MB) the resident size stays at the high-water mark for the rest of the run. :func:`release_free_heap`
asks glibc to return every free page (``malloc_trim(0)``: a few milliseconds); it changes no tensor and no number.
On a C library without ``malloc_trim`` (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_free_heap() -> bool:
    """Return the heap's free pages to the operating system (glibc ``malloc_trim(0)``); ``True`` if it ran."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
