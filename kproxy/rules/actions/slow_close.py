"""The ``slow_close`` action: let nothing through, wait, then close: a broker that hangs before it dies.

YAML: ``- slow_close: {ms: 5000}``, or ``{ms: 5000, forward: true}``. From the request hit on,
the connection is a black hole (:mod:`kproxy.rules.actions.blackhole`: by default nothing more
reaches the broker; ``forward: true`` forwards requests and loses only their answers), and it
ends ``ms`` after the hit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.rules.actions.base import MAX_DURATION_MS, HitKey, RuleAction
from kproxy.rules.actions.blackhole import blackhole_detail, read_forward
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft


@dataclass(frozen=True, slots=True)
class SlowClose(RuleAction):
    """Let nothing more through, wait ``ms``, then close (``forward``: requests still reach the broker)."""

    ms: float
    forward: bool = False

    kind: ClassVar[str] = "slow_close"
    keys: ClassVar[tuple[str, ...]] = ("ms", "forward")
    counts_connection_fault: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0 < self.ms <= MAX_DURATION_MS:
            raise ValueError(f"ms must be > 0 and <= {MAX_DURATION_MS} (a week)")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        ms = reader.required(m, at, path, "ms", "milliseconds to hold the connection before closing it")
        return reader.made(at, path, {"ms": BAD if ms is None else reader.number(
            ms, f"{path}.ms", 0.0, exclusive=True, hi=MAX_DURATION_MS), "forward": read_forward(reader, m, path)}, cls)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.black_hole(key, self, forward=self.forward)
        draft.close_after_s = self.ms / 1000
        draft.connection_fault(key, f"{blackhole_detail(self.forward)}, closing in {self.ms:g}ms")
