"""Process-level memory tuning for a proxy that moves multi-megabyte frames.

glibc hands every freed block above its mmap threshold (128 KiB to 32 MiB,
adapting) straight back to the kernel, so each multi-megabyte Fetch response
kproxy reassembles is built in fresh pages that fault in one by one: the
benchmark measured 6-10 ms of page faults per 5 MB frame. Raising the mmap and
trim thresholds keeps those buffers in the heap for reuse: ~10x cheaper frame
reassembly for a higher but bounded resident size (peak unchanged).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("kproxy.server")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's maximum on 64-bit
TRIM_THRESHOLD = 128 * 1024 * 1024


def tune_allocator() -> bool:
    """Raise glibc's mmap/trim thresholds; a no-op (False) on other C libraries."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # musl and others have no mallopt: nothing to tune
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    log.debug("event=allocator_tuned ok=%s", ok)
    return ok
