"""The ``drop_response`` action: forward the request, swallow the broker's response.

YAML: ``- drop_response``. The client times out and retries; the connection stays open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.rules.actions.base import HitKey, RuleAction

if TYPE_CHECKING:
    from kproxy.rules.actions.draft import VerdictDraft


@dataclass(frozen=True, slots=True)
class DropResponse(RuleAction):
    """Forward the request, swallow the response: the client times out and retries."""

    kind: ClassVar[str] = "drop_response"
    counts_connection_fault: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.drop = True
        draft.connection_fault(key, "the response will be swallowed")
