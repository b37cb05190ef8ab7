"""The ``slow_close`` action: stop answering, wait, then close: a broker that hangs before it dies.

YAML: ``- slow_close: {ms: 5000}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.rules.actions.base import MAX_DURATION_MS, HitKey, RuleAction
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft


@dataclass(frozen=True, slots=True)
class SlowClose(RuleAction):
    """Stop answering, wait ``ms``, then close."""

    ms: float

    kind: ClassVar[str] = "slow_close"
    keys: ClassVar[tuple[str, ...]] = ("ms",)
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
            ms, f"{path}.ms", 0.0, exclusive=True, hi=MAX_DURATION_MS)}, cls)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.blackhole = True
        draft.close_after_s = self.ms / 1000
        draft.connection_fault(key, f"no more answers on this connection, closing in {self.ms:g}ms")
