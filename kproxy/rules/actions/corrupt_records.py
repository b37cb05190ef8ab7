"""The ``corrupt_records`` action: damage the records of Produce requests and Fetch responses.

YAML: ``- corrupt_records: {target: crc|key|value|headers|timestamp}`` (``crc``, the default,
flips a byte the batch CRC-32C covers: clients see CORRUPT_MESSAGE or a CRC error).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.protocol.mutation import Mutation
from kproxy.protocol.record_faults import CorruptTarget, Selector, corrupt_records
from kproxy.protocol.records import RecordBudget
from kproxy.rules.actions.base import RuleAction
from kproxy.rules.actions.records import RecordAction
from kproxy.rules.yaml_nodes import Bad, NodeReader

if TYPE_CHECKING:
    import yaml


class RecordTarget(enum.Enum):
    CRC = "crc"  # flip a byte covered by the batch CRC-32C: clients see CORRUPT_MESSAGE / a CRC error
    KEY = "key"
    VALUE = "value"
    HEADERS = "headers"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class CorruptRecords(RecordAction):
    target: RecordTarget = RecordTarget.CRC

    kind: ClassVar[str] = "corrupt_records"
    keys: ClassVar[tuple[str, ...]] = ("target",)

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw = {"target": reader.choice(m["target"], f"{path}.target", RecordTarget)} if "target" in m else {}
        return reader.made(at, path, kw, cls)

    def label(self) -> str:
        return f"corrupt_records {self.target.value}"

    def edit(self, frame: bytes, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
             ) -> Mutation:
        return corrupt_records(frame, api_key, api_version, CorruptTarget(self.target.value), only=only,
                               budget=budget)
