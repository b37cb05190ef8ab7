"""The ``duplicate_records`` action: repeat the records of Produce requests and Fetch responses.

YAML: ``- duplicate_records: {copies: 1}`` (each record batch appears ``copies`` more times).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.protocol.mutation import Mutation
from kproxy.protocol.record_faults import Selector, duplicate_records
from kproxy.protocol.records import RecordBudget
from kproxy.rules.actions.base import RuleAction
from kproxy.rules.actions.records import RecordAction
from kproxy.rules.yaml_nodes import Bad, NodeReader

if TYPE_CHECKING:
    import yaml


@dataclass(frozen=True, slots=True)
class DuplicateRecords(RecordAction):
    copies: int = 1

    kind: ClassVar[str] = "duplicate_records"
    keys: ClassVar[tuple[str, ...]] = ("copies",)

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise ValueError("copies must be >= 1")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw = {"copies": reader.integer(m["copies"], f"{path}.copies", 1, 1000)} if "copies" in m else {}
        return reader.made(at, path, kw, cls)

    def label(self) -> str:
        return f"duplicate_records copies={self.copies}"

    def edit(self, frame: bytes, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
             ) -> Mutation:
        return duplicate_records(frame, api_key, api_version, self.copies, only=only)
