"""Process-level memory tuning for kproxy's processes: the proxy and its capture worker.

glibc hands every freed block above its mmap threshold (128 KiB to 32 MiB,
adapting) straight back to the kernel, so each multi-megabyte Fetch response
kproxy reassembles is built in fresh pages that fault in one by one. Raising
the mmap and trim thresholds keeps those buffers in the heap for reuse: a much
cheaper frame reassembly for a higher but bounded resident size (peak unchanged;
docs/PERFORMANCE.md has the figures).

The cyclic garbage collector is tuned too (:func:`tune_gc`, :func:`freeze_start_up`). In the
proxy, with a thousand connections open, each request wakes cold per-connection state, and
CPython's default of a generation-0 collection every 700 container allocations, with the
survivors promoted and the whole heap walked once they add up, showed as a large part of the CPU
per request. The capture worker makes a few tuples per captured exchange and keeps a row group's
worth of them alive until it is written, over a heap that pyarrow's modules make large: the same
two settings take most collections out of its work (docs/PERFORMANCE.md has both measurements).

A leaf: the standard library only, so that any process entry of kproxy may call it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("kproxy.server")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's maximum on 64-bit
TRIM_THRESHOLD = 128 * 1024 * 1024
# Container allocations (net of frees) between generation-0 collections; CPython's default is 700.
# Fewer collections also promote fewer objects that were only briefly alive (an exchange in
# flight, a connection's buffers), so full collections come rarer still. The young generation
# this lets build up is a few MB at most.
GEN0_THRESHOLD = 10_000


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


def tune_gc() -> None:
    """Collect generation 0 every ``GEN0_THRESHOLD`` allocations (the older generations' settings stay)."""
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


def freeze_start_up() -> None:
    """Leave what start-up built out of every later collection (``gc.freeze``).

    Called once a process's start-up is over (the proxy: the server up and its codecs compiled;
    the capture worker: its writer started, pyarrow loaded): the message tables, codecs, metric
    families, configuration and modules live as long as the process, and a full collection would walk
    every one of them again. Objects frozen are still freed by reference counting; only cycles
    among them would stay, and start-up builds none that it drops.
    """
    gc.collect()
    gc.freeze()
