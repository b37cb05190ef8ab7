"""Byte-level toxics, sans-IO: given the bytes one direction of a connection is about to write and
the time, what to write when.

A :class:`Toxic` is a frozen value a rule action makes (bandwidth, slicer, limit_data, delay
``at: wire``): it says what to do, for every connection. :meth:`Toxic.start` gives one
connection's :class:`Stage`, which keeps that connection's state (the link's next free time, the
bytes left before a cut, the last slice's time). A :class:`WireShaper` holds the stages installed
on one direction of one connection and chains them:
:meth:`WireShaper.shape` turns a chunk read at ``now`` into pieces ``(due, bytes)``, in stream
order and with non-decreasing due times, which the server writes one after the other, each no
earlier than its due time (kproxy/server/toxic_writer.py).

Whatever the rules' order, stages chain in one order: ``limit_data`` (bytes are counted as they
enter, so a cut does not depend on time), latency, bandwidth, slicer (so its slices are the writes
the socket sees). Several toxics of one kind apply one after the other: latencies add up, the
slowest bandwidth and the smallest limit win, slices of slices are the smaller.

This module imports nothing of kproxy: the rules floor (which makes toxics) and the proxy and
server floors (which carry and apply them) all read it.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar, Protocol

# What to write and when: (due time on the shaper's clock, in seconds; the bytes).
Piece = tuple[float, bytes | memoryview]
# A pace stage writes at most this much of its rate at once (1/100 s of it): a big chunk leaves as
# many small writes spread over its transmission time, not one write followed by a long wait.
PACE_STEPS_PER_SECOND = 100


class Direction(enum.Enum):
    """Which bytes a toxic acts on: ``upstream`` the client's to the broker, ``downstream`` the
    broker's (and kproxy's own answers) to the client, ``both`` each of them."""

    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"
    BOTH = "both"

    @property
    def upstream(self) -> bool:
        return self is not Direction.DOWNSTREAM

    @property
    def downstream(self) -> bool:
        return self is not Direction.UPSTREAM


class Stage(Protocol):
    """One toxic at work on one direction of one connection."""

    def shape(self, pieces: Iterable[Piece], now: float) -> Iterator[Piece]:
        """The pieces to write for ``pieces`` (those of one chunk read at ``now``), in order."""
        ...


class Toxic:
    """What a toxic does, for every connection (a frozen value); :meth:`start` makes one
    connection's :class:`Stage`. ``rank`` is its place in a chain (see the module docstring)."""

    __slots__ = ()
    rank: ClassVar[int]

    def start(self, rng: random.Random) -> Stage:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Limit(Toxic):
    """Let ``bytes`` through, then cut: the connection ends once the last of them is written."""

    bytes: int
    rank: ClassVar[int] = 0

    def __post_init__(self) -> None:
        if self.bytes < 0:
            raise ValueError("bytes must be >= 0")

    def start(self, rng: random.Random) -> LimitStage:
        return LimitStage(self.bytes)


class LimitStage:
    """:class:`Limit` on one connection: ``left`` bytes may still pass; ``reached`` once none may."""

    __slots__ = ("left", "reached")

    def __init__(self, left: int) -> None:
        self.left = left
        self.reached = left == 0

    def shape(self, pieces: Iterable[Piece], now: float) -> Iterator[Piece]:
        for due, data in pieces:
            if self.reached:
                return
            if len(data) >= self.left:
                data = memoryview(data)[:self.left]
                self.left = 0
                self.reached = True
            else:
                self.left -= len(data)
            yield due, data


@dataclass(frozen=True, slots=True)
class Latency(Toxic):
    """Each chunk leaves ``delay_s(draw)`` seconds after it was read (one uniform draw in [0, 1)
    per chunk), and never before the chunk ahead of it."""

    delay_s: Callable[[float], float]
    rank: ClassVar[int] = 1

    def start(self, rng: random.Random) -> LatencyStage:
        return LatencyStage(self.delay_s, rng)


class LatencyStage:
    __slots__ = ("delay_s", "last", "rng")

    def __init__(self, delay_s: Callable[[float], float], rng: random.Random) -> None:
        self.delay_s = delay_s
        self.rng = rng
        self.last = 0.0  # the due time of the previous chunk: order is kept

    def shape(self, pieces: Iterable[Piece], now: float) -> Iterator[Piece]:
        due = self.last = max(now + self.delay_s(self.rng.random()), self.last)
        for at, data in pieces:
            yield max(at, due), data


@dataclass(frozen=True, slots=True)
class Pace(Toxic):
    """Bytes leave at ``bytes_per_second``: a write of n bytes keeps the link busy n / rate seconds,
    and the next write waits for it. An idle link earns no credit: a burst after a pause is paced too."""

    bytes_per_second: float
    rank: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if not self.bytes_per_second > 0:
            raise ValueError("bytes_per_second must be > 0")

    def start(self, rng: random.Random) -> PaceStage:
        return PaceStage(self.bytes_per_second)


class PaceStage:
    __slots__ = ("free", "rate", "step")

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.step = max(1, int(rate / PACE_STEPS_PER_SECOND))
        self.free = 0.0  # when the link has sent everything written so far

    def shape(self, pieces: Iterable[Piece], now: float) -> Iterator[Piece]:
        step, rate = self.step, self.rate
        for due, data in pieces:
            view = memoryview(data) if len(data) > step else data
            for start in range(0, len(data), step):
                part = view[start:start + step] if view is not data else data
                at = max(due, self.free)
                self.free = at + len(part) / rate
                yield at, part


@dataclass(frozen=True, slots=True)
class Slices(Toxic):
    """Bytes leave as writes of ``average_bytes`` ± ``size_variation`` (uniform; at least 1), each at
    least ``delay_s`` after the one before."""

    average_bytes: int
    size_variation: int = 0
    delay_s: float = 0.0
    rank: ClassVar[int] = 3

    def __post_init__(self) -> None:
        if self.average_bytes < 1:
            raise ValueError("average_bytes must be >= 1")
        if not 0 <= self.size_variation < self.average_bytes:
            raise ValueError("size_variation must be >= 0 and below average_bytes")
        if self.delay_s < 0:
            raise ValueError("the delay must be >= 0")

    def start(self, rng: random.Random) -> SlicesStage:
        return SlicesStage(self, rng)


class SlicesStage:
    __slots__ = ("last", "rng", "toxic")

    def __init__(self, toxic: Slices, rng: random.Random) -> None:
        self.toxic = toxic
        self.rng = rng
        self.last = -1e300  # the previous slice's due time

    def shape(self, pieces: Iterable[Piece], now: float) -> Iterator[Piece]:
        t = self.toxic
        low, high, delay = t.average_bytes - t.size_variation, t.average_bytes + t.size_variation, t.delay_s
        draw = self.rng.randint
        for due, data in pieces:
            view = memoryview(data)
            start, end = 0, len(data)
            while start < end:
                size = draw(low, high) if high > low else low
                at = max(due, self.last + delay)
                self.last = at
                yield at, view[start:start + size]
                start += size


class Owner(Protocol):
    """Who installed a stage (a rule's action, kproxy.policy.rule_toxics): asked whether it is still in
    force before each chunk, told the bytes it let through and when it cut the connection."""

    @property
    def label(self) -> str: ...

    def in_force(self) -> bool: ...

    def passed(self, direction: Direction, nbytes: int) -> None: ...

    def cut(self, direction: Direction) -> None: ...


@dataclass(frozen=True, slots=True, eq=False)
class WireOrder:
    """A toxic for a connection to install (a rule's verdict carries it: kproxy.proxy.verdict).

    ``key`` names it on the connection: an order whose key is installed and not ended is already
    there (every request a rule hits brings its order again). ``seed`` seeds the stage's random
    draws (slice sizes, jitter), so that one client's run replays."""

    key: object
    owner: Owner
    direction: Direction
    toxic: Toxic
    seed: str


@dataclass(slots=True, eq=False)
class Installed:
    """A stage on a shaper: ``ended`` once its owner was no longer in force (it is gone for good:
    a later hit of the rule installs a new one)."""

    owner: Owner
    toxic: Toxic
    stage: Stage
    ended: bool = False


class WireShaper:
    """The toxics installed on one direction of one connection (see the module docstring).

    ``cut`` is set (to the limit's owner) once a ``limit_data`` let its last byte through: the
    writer ends the connection after writing the chunk's pieces."""

    __slots__ = ("cut", "direction", "installed")

    def __init__(self, direction: Direction) -> None:
        self.direction = direction
        self.installed: list[Installed] = []
        self.cut: Owner | None = None

    def install(self, owner: Owner, toxic: Toxic, rng: random.Random) -> Installed:
        entry = Installed(owner, toxic, toxic.start(rng))
        self.installed.append(entry)
        self.installed.sort(key=lambda e: e.toxic.rank)  # stable: one kind keeps its install order
        return entry

    @property
    def active(self) -> bool:
        return bool(self.installed)

    def shape(self, data: bytes | bytearray | memoryview, now: float) -> Iterator[Piece]:
        """The pieces of a chunk read at ``now``; stages whose owner is no longer in force are
        dropped first (their ``ended`` set). With none left the chunk is one piece, due at once."""
        installed = self.installed
        if any(not e.owner.in_force() for e in installed):
            for e in installed:
                if not e.owner.in_force():
                    e.ended = True
            installed[:] = [e for e in installed if not e.ended]
        pieces: Iterable[Piece] = ((now, bytes(data) if isinstance(data, bytearray) else data),)
        for e in installed:
            pieces = e.stage.shape(pieces, now)
        return self._watch(pieces)

    def _watch(self, pieces: Iterable[Piece]) -> Iterator[Piece]:
        """``pieces``, then the bytes they made counted to each owner, and a reached limit noted."""
        total = 0
        for piece in pieces:
            total += len(piece[1])
            yield piece
        for e in self.installed:
            if total:
                e.owner.passed(self.direction, total)
            stage = e.stage
            if self.cut is None and isinstance(stage, LimitStage) and stage.reached:
                self.cut = e.owner
                e.owner.cut(self.direction)


__all__ = ["Direction", "Installed", "Latency", "Limit", "Owner", "Pace", "Piece", "Slices", "Stage", "Toxic",
           "WireOrder", "WireShaper"]
