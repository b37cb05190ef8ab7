"""The ``reset_connection`` action: abort the client's connection with a TCP RST instead of forwarding.

YAML: ``- reset_connection``. The server closes the socket with SO_LINGER 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.rules.actions.base import HitKey, RuleAction

if TYPE_CHECKING:
    from kproxy.rules.actions.draft import VerdictDraft


@dataclass(frozen=True, slots=True)
class ResetConnection(RuleAction):
    """Abort the client connection with a TCP RST (SO_LINGER 0)."""

    kind: ClassVar[str] = "reset_connection"
    counts_connection_fault: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.close(key, abort=True)
        draft.connection_fault(key, "RST")
