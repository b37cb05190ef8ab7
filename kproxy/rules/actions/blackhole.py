"""The ``blackhole`` action: keep the connection open and let nothing through it again.

YAML: ``- blackhole``, or ``- blackhole: {forward: true}``. From the request hit on, the
connection is a partitioned network (Toxiproxy's ``timeout`` toxic without its close): requests
are read and discarded, none reaches the broker and none is answered, so a producer's records
are not written behind its back. With ``forward: true`` they still reach the broker and only the
answers are lost: records are written but never acknowledged (``drop_response`` for every
request from then on). What bounds a client's wait is its own request timeout (rules/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.rules.actions.base import HitKey, RuleAction
from kproxy.rules.yaml_nodes import Bad, NodeReader

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft


def read_forward(reader: NodeReader, m: dict[str, yaml.Node], path: str) -> bool | Bad:
    """The optional ``forward`` key of ``blackhole`` and ``slow_close`` (default false)."""
    return reader.boolean(m["forward"], f"{path}.forward") if "forward" in m else False


def blackhole_detail(forward: bool) -> str:
    """What a fault line says a black hole does with the connection's requests."""
    return ("no more answers on this connection; requests still reach the broker" if forward
            else "nothing more reaches the broker or the client on this connection")


@dataclass(frozen=True, slots=True)
class Blackhole(RuleAction):
    """Let nothing more through the connection (``forward``: requests still reach the broker)."""

    forward: bool = False

    kind: ClassVar[str] = "blackhole"
    keys: ClassVar[tuple[str, ...]] = ("forward",)
    counts_connection_fault: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        return reader.made(at, path, {"forward": read_forward(reader, m, path)}, cls)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.black_hole(key, self, forward=self.forward)
        draft.connection_fault(key, blackhole_detail(self.forward))
