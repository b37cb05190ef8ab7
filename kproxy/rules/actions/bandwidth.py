"""The ``bandwidth`` action: pace the connection's bytes on the wire, as a slow link would.

YAML: ``- bandwidth: {bytes_per_second: 262144, direction: downstream}``. From the first request
the rule matches on a connection on, that connection's bytes in ``direction``
(:mod:`kproxy.rules.actions.direction`) leave at that rate
(:class:`kproxy.toxics.Pace`), while the rule is in force. No Kafka quota is involved: no
``throttle_time_ms``, just slow bytes (``throttle`` is the broker's quota).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.rules.actions.base import HitKey, RuleAction
from kproxy.rules.actions.direction import DEFAULT_DIRECTION, read_direction
from kproxy.rules.actions.throttle import MAX_RATE, MIN_BYTES_PER_SECOND
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader
from kproxy.toxics import Direction, Pace

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft


@dataclass(frozen=True, slots=True)
class Bandwidth(RuleAction):
    """Pace the matched connection's bytes in ``direction`` to ``bytes_per_second``."""

    bytes_per_second: float
    direction: Direction = DEFAULT_DIRECTION

    kind: ClassVar[str] = "bandwidth"
    keys: ClassVar[tuple[str, ...]] = ("bytes_per_second", "direction")
    decides: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not MIN_BYTES_PER_SECOND <= self.bytes_per_second <= MAX_RATE:
            raise ValueError(f"bytes_per_second must be between {MIN_BYTES_PER_SECOND:g} and {MAX_RATE:g}")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        rate = reader.required(m, at, path, "bytes_per_second", "the rate bytes leave at")
        kw["bytes_per_second"] = BAD if rate is None else reader.number(
            rate, f"{path}.bytes_per_second", MIN_BYTES_PER_SECOND, hi=MAX_RATE)
        read_direction(reader, m, path, kw)
        return reader.made(at, path, kw, cls)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.wire_toxic(key, self, self.direction, Pace(self.bytes_per_second))
        draft.fault(key, f"{self.bytes_per_second:g} bytes/s {self.direction.value}")
