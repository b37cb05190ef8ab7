"""The ``blackhole`` action: keep the connection open and never answer again on it.

YAML: ``- blackhole``. The request hit, and every later one of the connection, gets no answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.rules.actions.base import HitKey, RuleAction

if TYPE_CHECKING:
    from kproxy.rules.actions.draft import VerdictDraft


@dataclass(frozen=True, slots=True)
class Blackhole(RuleAction):
    """Keep the connection open and never answer this request (nor later ones)."""

    kind: ClassVar[str] = "blackhole"
    counts_connection_fault: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.blackhole = True
        draft.connection_fault(key, "no more answers on this connection")
