"""The ``blackhole`` action: keep the connection open and let nothing through it while the rule lasts.

YAML: ``- blackhole``, ``- blackhole: {forward: true}``, ``- blackhole: {close_after_ms: 5000}``.
From the request hit on, while the rule is in force (kproxy.policy.in_force), the connection is a
partitioned network (Toxiproxy's ``timeout`` toxic; with ``close_after_ms``, its timeout): requests
are read and discarded, none reaches the broker and none is answered, so a producer's records are
not written behind its back. With ``forward: true`` they still reach the broker and only the
answers are lost: records are written but never acknowledged (``drop_response`` for every request
from then on). With ``close_after_ms`` the connection ends that long after the hit, unless the
rule ended first. When the rule ends, requests read from then on flow again; those swallowed stay
unanswered. What bounds a client's wait is its own request timeout (rules/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.rules.actions.base import MAX_DURATION_MS, HitKey, RuleAction
from kproxy.rules.yaml_nodes import Bad, NodeReader

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft


def read_forward(reader: NodeReader, m: dict[str, yaml.Node], path: str) -> bool | Bad:
    """The optional ``forward`` key of ``blackhole`` (default false)."""
    return reader.boolean(m["forward"], f"{path}.forward") if "forward" in m else False


def blackhole_detail(forward: bool) -> str:
    """What a fault line says a black hole does with the connection's requests."""
    return ("no more answers on this connection; requests still reach the broker" if forward
            else "nothing more reaches the broker or the client on this connection")


@dataclass(frozen=True, slots=True)
class Blackhole(RuleAction):
    """Let nothing more through the connection while the rule lasts (``forward``: requests still
    reach the broker; ``close_after_ms``: then close the connection that long after the hit)."""

    forward: bool = False
    close_after_ms: float | None = None

    kind: ClassVar[str] = "blackhole"
    keys: ClassVar[tuple[str, ...]] = ("forward", "close_after_ms")
    counts_connection_fault: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.close_after_ms is not None and not 0 < self.close_after_ms <= MAX_DURATION_MS:
            raise ValueError(f"close_after_ms must be > 0 and <= {MAX_DURATION_MS} (a week)")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, object] = {"forward": read_forward(reader, m, path)}
        if "close_after_ms" in m:
            kw["close_after_ms"] = reader.number(m["close_after_ms"], f"{path}.close_after_ms", 0.0, exclusive=True,
                                                 hi=MAX_DURATION_MS)
        return reader.made(at, path, kw, cls)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.black_hole(key, self, forward=self.forward)
        detail = blackhole_detail(self.forward)
        if self.close_after_ms is not None:
            draft.close_after_s = self.close_after_ms / 1000
            detail += f", closing in {self.close_after_ms:g}ms"
        draft.connection_fault(key, detail)
