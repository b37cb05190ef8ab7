"""Work done in a worker thread that must not hold the trio loop: :func:`off_loop_build`.

A worker thread running Python code shares the GIL with the loop thread, and two things let it
hold the loop far longer than its share:

* **the cyclic collector**: a collection walks its generation while holding the GIL. The
  collections that building 10,000 rules (~140,000 objects) set off held the loop 0.1-1.1 s
  each, and once such a rule set was in force every full collection walked it again (~0.15 s);
* **the switch interval**: every time the loop thread comes back from a system call (each
  ``send``, ``recv``, ``epoll_wait``) it waits for the GIL, up to ``sys.getswitchinterval()``
  (5 ms) while the worker computes; a loop turn of twenty system calls then took 100 ms.

So while a build runs the collector is off and the interval is 0.5 ms. With ``build.keep`` set
(what was built stays: a big rule set put in force), everything alive is frozen when the last
build ends (``gc.freeze``, as kproxy.server.memory.freeze_start_up does after start-up): never
walked again, still freed by reference counting once replaced (a rule set holds no cycles:
``gc.collect`` found none after building and dropping 10,000 rules). The price: cycles that
other threads' objects of that moment end in are never collected, so ``keep`` is for big builds
only, not every edit.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Iterator

BUILD_SWITCH_INTERVAL = 0.0005

_lock = threading.Lock()
_builds = 0  # builds under way (any thread); the collector and the interval come back when none is
_freeze_at_end = False
_switch_interval = 0.005


class Build:
    """An :func:`off_loop_build` block: set :attr:`keep` when what it built is big and stays."""

    keep = False


@contextlib.contextmanager
def off_loop_build() -> Iterator[Build]:
    """Run a big build (a rule set, its listing) in this worker thread with the loop served first."""
    global _builds, _freeze_at_end, _switch_interval
    build = Build()
    with _lock:
        if _builds == 0:
            _switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(BUILD_SWITCH_INTERVAL)
            gc.disable()
        _builds += 1
    try:
        yield build
    finally:
        with _lock:
            _builds -= 1
            _freeze_at_end = _freeze_at_end or build.keep
            if _builds == 0:
                if _freeze_at_end:
                    gc.freeze()
                    _freeze_at_end = False
                gc.enable()
                sys.setswitchinterval(_switch_interval)


__all__ = ["Build", "off_loop_build"]
