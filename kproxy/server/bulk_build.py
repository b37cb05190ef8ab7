"""Building a big rule set in a worker thread without the cyclic garbage collector stalling the loop.

Why: parsing 100,000 rules makes millions of objects (YAML nodes and their marks, then the rules
and their injector: some 1.7 million that stay). CPython's collector runs a full collection
whenever the objects that survived grew by a quarter, and a full collection walks every tracked
object holding the GIL: with millions of them, seconds during which the trio thread cannot run,
whichever thread triggered it. Measured on a reload of 100,000 rules: full collections of up to
10 s, the event loop blocked as long, and the build itself five times slower.

So a build runs with the collector paused (:func:`collector_paused`), and when it has left many
objects (:data:`FREEZE_ABOVE`) they are moved out of the collector's sight with ``gc.freeze()``
(:func:`freeze_if_many`), so that no later collection walks them either. That is sound here because
what a build makes holds no reference cycles (checked by tests/test_rules_reload_hostile.py): when
a rule set is replaced, reference counting frees it, frozen or not. The cost: objects alive
elsewhere at the moment of a freeze, if they later become *cyclic* garbage, are never collected;
that is why only big builds freeze (a handful of rules never do), once per build.

Reference counting frees everything else as usual while the collector is paused; only cyclic
garbage made meanwhile waits until the build ends (seconds).
"""

from __future__ import annotations

import atexit
import gc
import threading
import types
from collections.abc import Collection, Iterator
from contextlib import contextmanager

# Objects a build may leave before they are frozen: a few thousand rules' worth. Below it a full
# collection over them costs milliseconds; above it, each one more stalls the loop.
FREEZE_ABOVE = 200_000

_lock = threading.Lock()
_paused = 0  # builds under way: the collector resumes when the last one ends
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (process-wide) for the block; nested and concurrent
    blocks (the reloader and an admin edit at once) resume it when the last one ends, and only if
    it was on before the first began."""
    global _paused, _was_enabled
    with _lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()


@atexit.register
def _freeze_at_exit_if_building() -> None:
    """A build abandoned at shutdown (kproxy/server/rules_reload.py) leaves its thread holding
    millions of objects, and the interpreter's teardown collects garbage whether or not the
    collector is on: each collection walked them all, and ``kproxy run`` took 5 s more to exit
    after SIGTERM. Frozen, they are never walked."""
    if _paused:
        gc.freeze()


def freeze_if_many() -> bool:
    """Within :func:`collector_paused`: freeze every tracked object if the objects made since the
    last collection are more than :data:`FREEZE_ABOVE` (True when it froze)."""
    if gc.get_count()[0] <= FREEZE_ABOVE:
        return False
    gc.freeze()
    return True




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


__all__ = ["FREEZE_ABOVE", "collector_paused", "freeze_if_many", "hold_parts", "release_parts"]
