"""Big work in a worker thread that must not hold the trio loop: building rule sets and listings,
reading huge answers for the capture.

A worker thread running Python code shares the GIL with the loop thread, and three things let it
hold the loop far longer than its share:

* **the cyclic collector**: a collection walks its generation while holding the GIL, whichever
  thread set it off. Building 10,000 rules (~140,000 objects) set off collections holding the
  loop 0.1-1.1 s each; a reload of 100,000 rules (some 1.7 million objects that stay, millions of
  YAML nodes that do not) full collections of up to 10 s. Once such a set is in force, every full
  collection walked it again.
* **the switch interval**: every time the loop thread comes back from a system call (each
  ``send``, ``recv``, ``epoll_wait``) it waits for the GIL, up to ``sys.getswitchinterval()``
  (5 ms) while the worker computes, so a loop turn of many system calls takes many intervals.
* **one big deallocation**: dropping a container of a million objects frees them in one
  cascade, seconds of GIL (:func:`hold_parts` / :func:`release_parts` spread it).

So while a build runs (:func:`off_loop_build`, nested and concurrent builds counted: the reloader
and an admin edit at once) the collector is paused and the interval is 0.5 ms; both come back
when the last build ends, the collector only if it was on before the first began. The interval
has one owner, :func:`short_switch_interval`, which other long reads off the loop enter too (the
capture's writer reading a huge Metadata answer): its holders are counted under a lock, whatever
thread enters or leaves first, so the interval found by the first is the one left by the last.
The capture's writer holds it for each of its turns.

What a big build leaves is moved out of the collector's sight with ``gc.freeze()`` (as
kproxy.memory.freeze_start_up does after start-up): either when the objects made exceed
:data:`FREEZE_ABOVE` (:func:`freeze_if_many`) or, at the last build's end, when a build set
``keep`` (a big rule set put in force). That is sound because what a build makes holds no
reference cycles (tests/test_rules_reload_hostile.py checks it): a replaced rule set is freed by
reference counting, frozen or not. The price: objects alive elsewhere at a freeze that later
become *cyclic* garbage are never collected; so only big builds freeze.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import sys
import threading
import types
from collections.abc import Collection, Iterator

# The switch interval while work runs off the loop: the loop thread, back from a system call, waits
# this long at most for the GIL instead of the interpreter's 5 ms.
SHORT_SWITCH_INTERVAL = 0.0005
# Objects a build may leave before they are frozen: a few thousand rules' worth. Below it a full
# collection over them costs milliseconds; above it, each one more stalls the loop.
FREEZE_ABOVE = 200_000

_lock = threading.Lock()
_builds = 0  # builds under way (any thread); the collector comes back when none is
_was_enabled = False
_freeze_at_end = False
_interval_lock = threading.Lock()
_interval_holders = 0  # threads inside short_switch_interval (any thread, nested counted)
_interval_before = 0.005  # the interval the first of them found, given back when the last leaves


@contextlib.contextmanager
def short_switch_interval() -> Iterator[None]:
    """The interpreter's switch interval at most :data:`SHORT_SWITCH_INTERVAL` inside the block, for
    the thread that enters it and every other: the loop thread waits less for the GIL while this
    one computes. Blocks may nest and overlap across threads in any order; the interval found by
    the first to enter comes back when the last leaves (not before, not another one)."""
    global _interval_before, _interval_holders
    with _interval_lock:
        if _interval_holders == 0:
            _interval_before = sys.getswitchinterval()
            if _interval_before > SHORT_SWITCH_INTERVAL:  # (set only to change it: it is kept in whole µs)
                sys.setswitchinterval(SHORT_SWITCH_INTERVAL)
        _interval_holders += 1
    try:
        yield
    finally:
        with _interval_lock:
            _interval_holders -= 1
            if _interval_holders == 0 and _interval_before > SHORT_SWITCH_INTERVAL:
                sys.setswitchinterval(_interval_before)


class Build:
    """An :func:`off_loop_build` block: set :attr:`keep` when what it built is big and stays."""

    keep = False


@contextlib.contextmanager
def off_loop_build() -> Iterator[Build]:
    """Run a big build in this worker thread with the loop served first (see the module's doc)."""
    global _builds, _freeze_at_end, _was_enabled
    build = Build()
    with _lock:
        if _builds == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _builds += 1
    try:
        with short_switch_interval():
            yield build
    finally:
        with _lock:
            _builds -= 1
            _freeze_at_end = _freeze_at_end or build.keep
            if _builds == 0:
                if _freeze_at_end:
                    gc.freeze()
                    _freeze_at_end = False
                if _was_enabled:
                    gc.enable()


def freeze_if_many() -> bool:
    """Within :func:`off_loop_build`: freeze every tracked object if the objects made since the
    last collection are more than :data:`FREEZE_ABOVE` (True when it froze)."""
    if gc.get_count()[0] <= FREEZE_ABOVE:
        return False
    gc.freeze()
    return True


@atexit.register
def _freeze_at_exit_if_building() -> None:
    """A build abandoned at shutdown (kproxy/server/rules_reload.py) leaves its thread holding
    millions of objects, and the interpreter's teardown collects garbage whether or not the
    collector is on: each collection walked them all, and ``kproxy run`` took seconds more to
    exit after SIGTERM. Frozen, they are never walked."""
    if _builds:
        gc.freeze()


_LEAVES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, str, bytes)


def hold_parts(root: object, *, keep_out: Collection[object] = (), fan_out: int = 64,
               depth: int = 8) -> list[object]:
    """References to the items of every big container (over ``fan_out`` items) inside ``root``.

    Held, they outlive ``root``: when its last reference goes (on whatever thread), its big
    containers are freed without freeing their items, a loop of reference decrements; the items
    then go one at a time (:func:`release_parts`), each one a small cascade, so no single
    deallocation holds the GIL for long. The walk goes through kproxy's own objects and small
    containers only, never into ``keep_out`` (what ``root`` shares with the objects that replace it:
    the counters, the topic ids map), nor into classes, modules or functions.
    """
    held: list[object] = []
    skip = {id(o) for o in keep_out}
    seen: set[int] = set()
    level = [root]
    for _ in range(depth):
        below: list[object] = []
        for obj in level:
            for ref in gc.get_referents(obj):
                if id(ref) in skip or id(ref) in seen or isinstance(ref, _LEAVES):
                    continue
                seen.add(id(ref))
                container = isinstance(ref, tuple | list | dict | set | frozenset)
                if container and len(ref) > fan_out:
                    held.extend(gc.get_referents(ref))
                elif container or type(ref).__module__.startswith("kproxy."):
                    below.append(ref)
        level = below
    return held


def release_parts(parts: list[object]) -> None:
    """Drop what :func:`hold_parts` held, one item at a time (a worker thread's job: the interpreter
    switches threads between items)."""
    while True:
        try:
            parts.pop()
        except IndexError:  # emptied (also by another releaser of the same list)
            return


__all__ = ["FREEZE_ABOVE", "SHORT_SWITCH_INTERVAL", "Build", "freeze_if_many", "hold_parts", "off_loop_build",
           "release_parts", "short_switch_interval"]
