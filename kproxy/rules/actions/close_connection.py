"""The ``close_connection`` action: close the client's connection (a FIN) instead of forwarding.

YAML: ``- close_connection``. The class is :class:`CloseClientConnection`: the session's own
command for closing a connection is :class:`kproxy.proxy.commands.CloseConnection`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.rules.actions.base import HitKey, RuleAction

if TYPE_CHECKING:
    from kproxy.rules.actions.draft import VerdictDraft


@dataclass(frozen=True, slots=True)
class CloseClientConnection(RuleAction):
    """Close the client connection (FIN) instead of forwarding."""

    kind: ClassVar[str] = "close_connection"
    counts_connection_fault: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.close(key, abort=False)
        draft.connection_fault(key, "FIN")
