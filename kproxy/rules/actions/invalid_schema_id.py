"""The ``invalid_schema_id`` action: rewrite the schema id of Confluent wire-format record values.

YAML: ``- invalid_schema_id: {schema_id: 2147483647}``: values that start with magic byte 0 get
this 4-byte schema id, so a deserializer asks the schema registry for a schema that is not there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kproxy.protocol.mutation import Mutation
from kproxy.protocol.record_faults import Selector, replace_schema_ids
from kproxy.protocol.records import RecordBudget
from kproxy.rules.actions.base import RuleAction
from kproxy.rules.actions.records import RecordAction
from kproxy.rules.yaml_nodes import INT32, Bad, NodeReader

if TYPE_CHECKING:
    import yaml


@dataclass(frozen=True, slots=True)
class InvalidSchemaId(RecordAction):
    """Rewrite the 4-byte schema id of Confluent wire-format values (magic byte 0)."""

    schema_id: int = 2**31 - 1

    kind: ClassVar[str] = "invalid_schema_id"
    keys: ClassVar[tuple[str, ...]] = ("schema_id",)

    def __post_init__(self) -> None:
        if not -(2**31) <= self.schema_id < 2**31:
            raise ValueError("a schema id is an int32")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw = {"schema_id": reader.integer(m["schema_id"], f"{path}.schema_id", *INT32)} if "schema_id" in m else {}
        return reader.made(at, path, kw, cls)

    def label(self) -> str:
        return f"invalid_schema_id {self.schema_id}"

    def edit(self, frame: bytes, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
             ) -> Mutation:
        return replace_schema_ids(frame, api_key, api_version, self.schema_id, only=only, budget=budget)
