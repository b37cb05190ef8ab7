"""The ``slicer`` action: cut the connection's bytes into small writes, which tests a client's
reassembly of frames split across reads.

YAML: ``- slicer: {average_bytes: 4, size_variation: 3, delay_us: 100, direction: downstream}``.
From the first request the rule matches on a connection on, that connection's bytes in
``direction`` (:mod:`kproxy.rules.actions.direction`) leave as writes of ``average_bytes`` ±
``size_variation`` bytes (uniform, drawn per write), each at least ``delay_us`` microseconds after
the one before (:class:`kproxy.toxics.Slices`), while the rule is in force.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.rules.actions.base import MAX_DURATION_MS, HitKey, RuleAction
from kproxy.rules.actions.direction import DEFAULT_DIRECTION, read_direction
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader
from kproxy.toxics import Direction, Slices

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft

MAX_SLICE_BYTES = 2**31 - 1
MAX_DELAY_US = MAX_DURATION_MS * 1000


@dataclass(frozen=True, slots=True)
class Slicer(RuleAction):
    """Write the matched connection's bytes in ``direction`` as small, spaced writes."""

    average_bytes: int
    size_variation: int = 0
    delay_us: float = 0.0
    direction: Direction = DEFAULT_DIRECTION

    kind: ClassVar[str] = "slicer"
    keys: ClassVar[tuple[str, ...]] = ("average_bytes", "size_variation", "delay_us", "direction")
    decides: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 1 <= self.average_bytes <= MAX_SLICE_BYTES:
            raise ValueError(f"average_bytes must be between 1 and {MAX_SLICE_BYTES}")
        if not 0 <= self.size_variation < self.average_bytes:
            raise ValueError(f"size_variation must be >= 0 and below average_bytes ({self.average_bytes}), "
                             f"got {self.size_variation}")
        if not 0 <= self.delay_us <= MAX_DELAY_US:
            raise ValueError(f"delay_us must be between 0 and {MAX_DELAY_US:g} (a week)")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        average = reader.required(m, at, path, "average_bytes", "the mean size of a write")
        kw["average_bytes"] = BAD if average is None else reader.integer(
            average, f"{path}.average_bytes", 1, MAX_SLICE_BYTES)
        if "size_variation" in m:
            kw["size_variation"] = reader.integer(m["size_variation"], f"{path}.size_variation", 0,
                                                  MAX_SLICE_BYTES)
        if "delay_us" in m:
            kw["delay_us"] = reader.number(m["delay_us"], f"{path}.delay_us", 0.0, hi=MAX_DELAY_US)
        read_direction(reader, m, path, kw)
        return reader.made(at, path, kw, cls)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.wire_toxic(key, self, self.direction,
                         Slices(self.average_bytes, self.size_variation, self.delay_us / 1e6))
        draft.fault(key, f"{self.average_bytes}±{self.size_variation} bytes every {self.delay_us:g}us "
                         f"{self.direction.value}")
