"""Process-level memory tuning for a proxy that moves multi-megabyte frames.

glibc hands every freed block above its mmap threshold (128 KiB to 32 MiB,
adapting) straight back to the kernel, so each multi-megabyte Fetch response
kproxy reassembles is built in fresh pages that fault in one by one: the
benchmark measured 6-10 ms of page faults per 5 MB frame. Raising the mmap and
trim thresholds keeps those buffers in the heap for reuse: ~10x cheaper frame
reassembly for a higher but bounded resident size (peak unchanged).

The cyclic garbage collector is tuned too (:func:`tune_gc`, :func:`freeze_start_up`): with a
thousand connections open, each request wakes cold per-connection state, and CPython's default
of a generation-0 collection every 700 container allocations, with the survivors promoted and
the whole heap walked once they add up, showed as a large part of the CPU per request: timed
with ``gc.callbacks`` over the same bench/bench_conns.py run, 1.25 s of collections with the
defaults, 0.27 s with both settings (0.67 s with the freeze alone, 0.52 s with the threshold alone).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import threading
from collections.abc import Iterator

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

    Called once the server is up and its codecs compiled: the message tables, codecs, metric
    families and configuration live as long as the process, and a full collection would walk
    every one of them again. Objects frozen are still freed by reference counting; only cycles
    among them would stay, and start-up builds none that it drops.
    """
    gc.collect()
    gc.freeze()


_pause_lock = threading.Lock()
_pauses = 0  # pauses under way (any thread); the collector runs again when none is
_freeze_at_resume = False


class Pause:
    """A :func:`collector_paused` block: set :attr:`keep` when what it built is big and stays."""

    keep = False


@contextlib.contextmanager
def collector_paused() -> Iterator[Pause]:
    """Build something big (a rule set of 10,000 rules: ~140,000 objects; its listing) in a worker
    thread without the cyclic collector holding the GIL, hence the trio loop, for its sake.

    A collection walks its generation while holding the GIL: the collections set off by such a
    build held the loop 0.1-1.1 s each, and once a big rule set was in force each full collection
    walked it again (~0.15 s). So the collector is off while a build runs. With ``pause.keep`` set
    (what was built stays: a big rule set put in force), everything alive is frozen when the last
    pause ends (``gc.freeze``, as :func:`freeze_start_up`): never walked again, still freed by
    reference counting once replaced (a rule set holds no cycles: ``gc.collect`` found none after
    building and dropping 10,000 rules). The price: cycles that other threads' objects of that
    moment end in are never collected, so ``keep`` is for big builds only, not every edit.
    """
    global _pauses, _freeze_at_resume
    pause = Pause()
    with _pause_lock:
        _pauses += 1
        gc.disable()
    try:
        yield pause
    finally:
        with _pause_lock:
            _pauses -= 1
            _freeze_at_resume = _freeze_at_resume or pause.keep
            if _pauses == 0:
                if _freeze_at_resume:
                    gc.freeze()
                    _freeze_at_resume = False
                gc.enable()
