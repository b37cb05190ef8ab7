"""The registry of fuzz targets, and the contract every target keeps.

A target takes one input (``bytes``) and returns normally when kproxy behaved:

* only the errors its surface documents escape kproxy's code
  (:class:`~kproxy.protocol.errors.ProtocolError` and its subclasses for the codec and the
  record editors, :class:`~kproxy.rules.RulesError` for the rules loader...); the target
  catches those, so ``struct.error``, ``IndexError``, ``KeyError``, ``RecursionError``,
  ``MemoryError``... propagate out of it and are findings;
* whatever extra check the target states (round trips, request order, an HTTP answer).

Time and memory per input are bounded by the engine (tests/fuzz/engine.py) and by the CI
replay (tests/fuzz/test_fuzz.py), not here.

Each target also knows its *seeds*: valid inputs built with kproxy's own encoders and
loaders, which the engine mutates (a random byte string almost never gets past a length
prefix; a valid frame with one byte changed reaches deep into the decoders).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    seeds: Callable[[], Iterator[bytes]]
    doc: str
    # Warms what a running kproxy already has (imports, generated scanners) before inputs are timed;
    # runs once per process however often it is called.
    prepare: Callable[[], None] | None = None


TARGETS: dict[str, Target] = {}


def target(seeds: Callable[[], Iterator[bytes]], prepare: Callable[[], None] | None = None, *,
           warm: bool = False) -> Callable[[Callable[[bytes], None]], Callable[[bytes], None]]:
    """Register ``fuzz_NAME`` as target ``NAME``; the first line of its docstring is its ``--list`` entry.

    ``warm``: its ``prepare`` runs every seed once (imports, generated codecs and scanners made then,
    not in the first timed input's bound)."""
    def register(fn: Callable[[bytes], None]) -> Callable[[bytes], None]:
        name = fn.__name__.removeprefix("fuzz_")

        def run_seeds() -> None:
            for data in seeds():
                fn(data)

        chosen = run_seeds if warm and prepare is None else prepare
        TARGETS[name] = Target(name, fn, seeds, (fn.__doc__ or "").strip().splitlines()[0],
                               None if chosen is None else functools.cache(chosen))
        return fn
    return register
