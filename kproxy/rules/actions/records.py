"""What the record actions (``corrupt_records``, ``duplicate_records``, ``invalid_schema_id``) share:
they edit the records of Produce requests and of Fetch responses, in the partitions their rule's
``topic``/``partition`` keys select, within the frame's record budget."""

from __future__ import annotations

from typing import ClassVar

from kproxy.protocol.api_keys import FETCH, PRODUCE
from kproxy.protocol.mutation import Mutation
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.records import RecordBudget
from kproxy.rules.actions.base import RuleAction, Step

RECORD_APIS: frozenset[int] = frozenset({PRODUCE, FETCH})


class RecordAction(RuleAction):
    """A record action: :meth:`label` and :meth:`edit` say what it does to one frame's records."""

    __slots__ = ()

    apis: ClassVar[frozenset[int] | None] = RECORD_APIS
    partition_scoped: ClassVar[bool] = True

    def label(self) -> str:
        """The start of its notes: its YAML name and parameters."""
        raise NotImplementedError

    def edit(self, frame: bytes, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
             ) -> Mutation:
        """Its edit of a Produce request's or a Fetch response's records."""
        raise NotImplementedError

    @property
    def edits_request(self) -> bool:
        return True

    @property
    def edits_response(self) -> bool:
        return True

    def request_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                     ) -> Step | None:
        return self._step(api_key, api_version, only, budget) if api_key == PRODUCE else None

    def response_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                      ) -> Step | None:
        return self._step(api_key, api_version, only, budget) if api_key == FETCH else None

    def _step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget) -> Step:
        return self.label(), lambda f: self.edit(f, api_key, api_version, only, budget)
