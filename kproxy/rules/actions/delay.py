"""The ``delay`` action: hold the request (or its response) for a time, with optional jitter.

YAML: ``- delay: {ms: 100, jitter_ms: 20, distribution: uniform|normal, at: request|response|wire,
direction: downstream}``. The engine draws each delay's jitter (:meth:`Delay.resolve`, reproducible:
kproxy.rules.engine); the session holds the request before forwarding it, or its response before
releasing it (still in request order). ``at: wire`` acts below the frame instead: from the first
request the rule matches on a connection on, every chunk of that connection's bytes in
``direction`` (:mod:`kproxy.rules.actions.direction`) leaves ``ms`` (± its own jitter) after
kproxy would have written it, in order (:class:`kproxy.toxics.Latency`), while the rule is in
force; ``direction`` is for ``at: wire`` only.

A ramp: ``ms: {from: 10, to: 500, over_seconds: 300}`` (:class:`Ramp`) grows the delay linearly
from ``from`` to ``to`` over that many seconds, counted from the start of the rule's time
conditions (its load, plus ``after_seconds``), and keeps ``to`` after; jitter is drawn around the
ramp's value. The engine works the value out per request through :meth:`Delay.hit_delay_ms` (a ramping
or jittered delay is never a fixed hit).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from kproxy.rules.actions.base import MAX_DURATION_MS, HitKey, RuleAction
from kproxy.rules.actions.direction import DEFAULT_DIRECTION, read_direction
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader
from kproxy.toxics import Direction, Latency

if TYPE_CHECKING:
    from kproxy.rules.actions.draft import VerdictDraft


class Distribution(enum.Enum):
    UNIFORM = "uniform"  # ms + U(-jitter, +jitter)
    NORMAL = "normal"  # ms + N(0, jitter) (standard deviation), clamped at 0


class DelayPoint(enum.Enum):
    REQUEST = "request"  # before forwarding the request
    RESPONSE = "response"  # before releasing the response (still in request order)
    WIRE = "wire"  # every chunk of bytes in a direction, from the first match on (kproxy.toxics)


@dataclass(frozen=True, slots=True)
class Ramp:
    """A delay growing linearly from ``from_ms`` to ``to_ms`` over ``over_s`` seconds, then ``to_ms``."""

    from_ms: float
    to_ms: float
    over_s: float

    def __post_init__(self) -> None:
        if not (0 <= self.from_ms <= MAX_DURATION_MS and 0 <= self.to_ms <= MAX_DURATION_MS):
            raise ValueError(f"from and to must be between 0 and {MAX_DURATION_MS} (a week)")
        if not 0 < self.over_s <= MAX_DURATION_MS / 1000:
            raise ValueError("over_seconds must be above 0 and at most 604800 (a week)")

    def ms_at(self, elapsed_s: float) -> float:
        """The delay ``elapsed_s`` seconds into the ramp."""
        if elapsed_s <= 0:
            return self.from_ms
        if elapsed_s >= self.over_s:
            return self.to_ms
        return self.from_ms + (self.to_ms - self.from_ms) * (elapsed_s / self.over_s)


@dataclass(frozen=True, slots=True)
class Delay(RuleAction):
    ms: float
    jitter_ms: float = 0.0
    distribution: Distribution = Distribution.UNIFORM
    at: DelayPoint = DelayPoint.REQUEST
    direction: Direction | None = None  # at: wire only (None there: DEFAULT_DIRECTION)
    ramp: Ramp | None = None  # ``ms`` given as a ramp; ``ms`` is then its ``from``

    kind: ClassVar[str] = "delay"
    keys: ClassVar[tuple[str, ...]] = ("ms", "jitter_ms", "distribution", "at", "direction")
    counts_held: ClassVar[bool] = True
    verdict_from_draws: ClassVar[bool] = True
    decides: ClassVar[bool] = True
    takes_delay: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.ms < 0 or self.jitter_ms < 0:
            raise ValueError("ms and jitter_ms must be >= 0")
        if not (self.ms <= MAX_DURATION_MS and self.jitter_ms <= MAX_DURATION_MS):
            raise ValueError(f"ms and jitter_ms must be <= {MAX_DURATION_MS} (a week)")
        if self.direction is not None and self.at is not DelayPoint.WIRE:
            raise ValueError("direction is for at: wire only (a request or response delay holds one frame)")
        if self.ramp is not None and self.at is DelayPoint.WIRE:
            raise ValueError("a ramp (ms: {from, to, over_seconds}) is for at: request or response: a wire "
                             "delay's chunks have no rule time")

    def resolve(self, draw: float, ms: float | None = None) -> float:
        """The delay in ms for a uniform draw in [0, 1) (the engine's, so runs replay), around
        ``ms`` (a ramp's value now; None: :attr:`ms`)."""
        mean = self.ms if ms is None else ms
        if self.jitter_ms == 0:
            return mean
        if self.distribution is Distribution.UNIFORM:
            return max(0.0, mean + (2 * draw - 1) * self.jitter_ms)
        # Inverse CDF of the same uniform draw: one draw per delay whatever the distribution.
        p = min(max(draw, 1e-12), 1 - 1e-12)
        return max(0.0, NormalDist(mean, self.jitter_ms).inv_cdf(p))

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        ms = reader.required(m, at, path, "ms", "milliseconds")
        if ms is not None and isinstance(ms, yaml.MappingNode):
            kw["ramp"] = ramp = cls.read_ramp(reader, ms, f"{path}.ms")
            kw["ms"] = ramp.from_ms if isinstance(ramp, Ramp) else BAD
        else:
            kw["ms"] = BAD if ms is None else reader.number(ms, f"{path}.ms", 0.0, hi=MAX_DURATION_MS)
        if "jitter_ms" in m:
            kw["jitter_ms"] = reader.number(m["jitter_ms"], f"{path}.jitter_ms", 0.0, hi=MAX_DURATION_MS)
        if "distribution" in m:
            kw["distribution"] = reader.choice(m["distribution"], f"{path}.distribution", Distribution)
        if "at" in m:
            kw["at"] = reader.choice(m["at"], f"{path}.at", DelayPoint)
        read_direction(reader, m, path, kw)
        return reader.made(at, path, kw, cls)

    @staticmethod
    def read_ramp(reader: NodeReader, node: yaml.Node, path: str) -> Ramp | Bad:
        m = reader.mapping(node, path, ("from", "to", "over_seconds"))
        if m is None:
            return BAD
        kw: dict[str, Any] = {}
        for key, name in (("from", "from_ms"), ("to", "to_ms")):
            value = reader.required(m, node, path, key, "milliseconds")
            kw[name] = BAD if value is None else reader.number(value, f"{path}.{key}", 0.0, hi=MAX_DURATION_MS)
        over = reader.required(m, node, path, "over_seconds", "seconds the ramp takes")
        kw["over_s"] = BAD if over is None else reader.number(over, f"{path}.over_seconds", 0.0, exclusive=True,
                                                               hi=MAX_DURATION_MS / 1000)
        return reader.made(node, path, kw, Ramp)

    @property
    def delay_draws(self) -> bool:
        return self.jitter_ms != 0

    @property
    def delay_varies(self) -> bool:
        return self.jitter_ms != 0 or self.ramp is not None

    def hit_delay_ms(self, elapsed_s: float, draw: float) -> float:
        ramp = self.ramp
        ms = self.ms if ramp is None else ramp.ms_at(elapsed_s)
        return self.resolve(draw, ms) if self.jitter_ms else ms

    @property
    def has_live_state(self) -> bool:
        return self.ramp is not None

    def live_state(self, elapsed_s: float, out: dict[str, Any]) -> None:
        if self.ramp is not None:  # the ramp's value now, one entry per ramping delay of the rule
            out.setdefault("ramp_ms", []).append(round(self.ramp.ms_at(elapsed_s), 3))

    def wire_delay_s(self, draw: float) -> float:
        """A wire delay in seconds for a uniform draw (one per chunk: kproxy.toxics.Latency)."""
        return self.resolve(draw) / 1000

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        ms = draft.next_delay_ms()  # drawn for every delay, so that the hit's later delays keep theirs
        if self.at is DelayPoint.WIRE:
            direction = self.direction or DEFAULT_DIRECTION
            draft.wire_toxic(key, self, direction, Latency(self.wire_delay_s))
            draft.fault(key, f"{self.ms:g}ms ±{self.jitter_ms:g} per chunk {direction.value}")
            return
        draft.hold(ms / 1000, key, at_response=self.at is DelayPoint.RESPONSE)
        draft.fault(key, f"{ms:.1f}ms at {self.at.value}")
