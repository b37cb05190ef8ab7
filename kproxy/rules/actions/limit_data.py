"""The ``limit_data`` action: close the connection once a number of bytes went through it.

YAML: ``- limit_data: {bytes: 65536, direction: downstream}``. From the first request the rule
matches on a connection on, that connection lets ``bytes`` more bytes through in ``direction``
(:mod:`kproxy.rules.actions.direction`; ``both``: that many each way), then closes (a FIN, right
after the last of them is written; ``bytes: 0`` closes at the first byte that would pass), while
the rule is in force (:class:`kproxy.toxics.Limit`). The cut counts as a connection fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.rules.actions.base import HitKey, RuleAction
from kproxy.rules.actions.direction import DEFAULT_DIRECTION, read_direction
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader
from kproxy.toxics import Direction, Limit

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft

MAX_BYTES = 2**63 - 1


@dataclass(frozen=True, slots=True)
class LimitData(RuleAction):
    """Close the matched connection after ``bytes`` more bytes in ``direction``."""

    bytes: int
    direction: Direction = DEFAULT_DIRECTION

    kind: ClassVar[str] = "limit_data"
    keys: ClassVar[tuple[str, ...]] = ("bytes", "direction")
    counts_connection_fault: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0 <= self.bytes <= MAX_BYTES:
            raise ValueError(f"bytes must be between 0 and {MAX_BYTES}")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        count = reader.required(m, at, path, "bytes", "how many bytes pass before the connection closes")
        kw["bytes"] = BAD if count is None else reader.integer(count, f"{path}.bytes", 0, MAX_BYTES)
        read_direction(reader, m, path, kw)
        return reader.made(at, path, kw, cls)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.wire_toxic(key, self, self.direction, Limit(self.bytes))
        draft.fault(key, f"closing after {self.bytes} bytes {self.direction.value}")
