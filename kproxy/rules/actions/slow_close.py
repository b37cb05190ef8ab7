"""The ``slow_close`` action: traffic passes, and the connection's close comes late (Toxiproxy's slow_close).

YAML: ``- slow_close: {delay_ms: 5000}``. From the request hit on, while the rule is in force
(kproxy.policy.in_force), the connection is untouched until it ends: when either end closes it (or
kproxy does, for any reason), kproxy closes both sockets ``delay_ms`` later, so the other end learns
of the close that much late, as behind a slow network stack. What kproxy called ``slow_close``
before (let nothing through, then close) is ``blackhole: {close_after_ms: N}``: the old keys
(``ms``, ``forward``) are refused with a message saying so, rather than read with a new meaning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import yaml

from kproxy.rules.actions.base import MAX_DURATION_MS, HitKey, RuleAction
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader

if TYPE_CHECKING:
    from kproxy.rules.actions.draft import VerdictDraft

# The keys of the former slow_close, refused with this pointer to what they meant.
FORMER = ("slow_close no longer swallows traffic: it passes traffic and delays the close (Toxiproxy's "
          "slow_close: {delay_ms: N}); what it did before is blackhole: {close_after_ms: N} "
          "(with forward: true to still forward requests)")


@dataclass(frozen=True, slots=True)
class SlowClose(RuleAction):
    """Let traffic pass; close the connection ``delay_ms`` after it ends."""

    delay_ms: float

    kind: ClassVar[str] = "slow_close"
    keys: ClassVar[tuple[str, ...]] = ("delay_ms",)
    counts_connection_fault: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0 < self.delay_ms <= MAX_DURATION_MS:
            raise ValueError(f"delay_ms must be > 0 and <= {MAX_DURATION_MS} (a week)")

    @classmethod
    def read_body(cls, reader: NodeReader, body: yaml.Node | None, node: yaml.Node, path: str,
                  apis: frozenset[int] | None) -> RuleAction | Bad | None:
        """The former slow_close's keys are refused with :data:`FORMER`; any other body is read as usual."""
        if isinstance(body, yaml.MappingNode):
            for key_node, _ in body.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value in ("ms", "forward"):
                    return reader.fail(key_node, f"{path}.{key_node.value}", FORMER)
        return None

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        ms = reader.required(m, at, path, "delay_ms", "milliseconds by which to delay the connection's close")
        return reader.made(at, path, {"delay_ms": BAD if ms is None else reader.number(
            ms, f"{path}.delay_ms", 0.0, exclusive=True, hi=MAX_DURATION_MS)}, cls)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.slow_close(key, self, self.delay_ms / 1000)
        draft.connection_fault(key, f"traffic passes; its close will come {self.delay_ms:g}ms late")
