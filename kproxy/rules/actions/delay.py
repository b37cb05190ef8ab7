"""The ``delay`` action: hold the request (or its response) for a time, with optional jitter.

YAML: ``- delay: {ms: 100, jitter_ms: 20, distribution: uniform|normal, at: request|response|wire,
direction: downstream}``. The engine draws each delay's jitter (:meth:`Delay.resolve`, reproducible:
kproxy.rules.engine); the session holds the request before forwarding it, or its response before
releasing it (still in request order). ``at: wire`` acts below the frame instead: from the first
request the rule matches on a connection on, every chunk of that connection's bytes in
``direction`` (:mod:`kproxy.rules.actions.direction`) leaves ``ms`` (± its own jitter) after
kproxy would have written it, in order (:class:`kproxy.wire_toxics.Latency`), while the rule is in
force; ``direction`` is for ``at: wire`` only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.rules.actions.base import MAX_DURATION_MS, HitKey, RuleAction
from kproxy.rules.actions.direction import DEFAULT_DIRECTION, read_direction
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader
from kproxy.wire_toxics import Direction, Latency

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft


class Distribution(enum.Enum):
    UNIFORM = "uniform"  # ms + U(-jitter, +jitter)
    NORMAL = "normal"  # ms + N(0, jitter) (standard deviation), clamped at 0


class DelayPoint(enum.Enum):
    REQUEST = "request"  # before forwarding the request
    RESPONSE = "response"  # before releasing the response (still in request order)
    WIRE = "wire"  # every chunk of bytes in a direction, from the first match on (kproxy.wire_toxics)


@dataclass(frozen=True, slots=True)
class Delay(RuleAction):
    ms: float
    jitter_ms: float = 0.0
    distribution: Distribution = Distribution.UNIFORM
    at: DelayPoint = DelayPoint.REQUEST
    direction: Direction | None = None  # at: wire only (None there: DEFAULT_DIRECTION)

    kind: ClassVar[str] = "delay"
    keys: ClassVar[tuple[str, ...]] = ("ms", "jitter_ms", "distribution", "at", "direction")
    counts_held: ClassVar[bool] = True
    verdict_from_draws: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.ms < 0 or self.jitter_ms < 0:
            raise ValueError("ms and jitter_ms must be >= 0")
        if not (self.ms <= MAX_DURATION_MS and self.jitter_ms <= MAX_DURATION_MS):
            raise ValueError(f"ms and jitter_ms must be <= {MAX_DURATION_MS} (a week)")
        if self.direction is not None and self.at is not DelayPoint.WIRE:
            raise ValueError("direction is for at: wire only (a request or response delay holds one frame)")

    def resolve(self, draw: float) -> float:
        """The delay in ms for a uniform draw in [0, 1) (the engine's, so runs replay)."""
        if self.jitter_ms == 0:
            return self.ms
        if self.distribution is Distribution.UNIFORM:
            return max(0.0, self.ms + (2 * draw - 1) * self.jitter_ms)
        # Inverse CDF of the same uniform draw: one draw per delay whatever the distribution.
        p = min(max(draw, 1e-12), 1 - 1e-12)
        return max(0.0, NormalDist(self.ms, self.jitter_ms).inv_cdf(p))

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        ms = reader.required(m, at, path, "ms", "milliseconds")
        kw["ms"] = BAD if ms is None else reader.number(ms, f"{path}.ms", 0.0, hi=MAX_DURATION_MS)
        if "jitter_ms" in m:
            kw["jitter_ms"] = reader.number(m["jitter_ms"], f"{path}.jitter_ms", 0.0, hi=MAX_DURATION_MS)
        if "distribution" in m:
            kw["distribution"] = reader.choice(m["distribution"], f"{path}.distribution", Distribution)
        if "at" in m:
            kw["at"] = reader.choice(m["at"], f"{path}.at", DelayPoint)
        read_direction(reader, m, path, kw)
        return reader.made(at, path, kw, cls)

    def wire_delay_s(self, draw: float) -> float:
        """A wire delay in seconds for a uniform draw (one per chunk: kproxy.wire_toxics.Latency)."""
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
