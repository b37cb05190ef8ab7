"""The ``downgrade_api_versions`` action: advertise lower versions in ApiVersions answers.

YAML: ``- downgrade_api_versions: {produce: 7, fetch: 11}`` (api name -> the highest version to
advertise; never below the lowest version kproxy knows for that api). Acts on api_versions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import yaml

from kproxy.protocol.api_keys import API_VERSIONS
from kproxy.protocol.codes import api_snake_name
from kproxy.protocol.message_schemas import supported_versions
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.records import RecordBudget
from kproxy.protocol.response_faults import downgrade_api_versions
from kproxy.rules.actions.base import RuleAction, Step
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader


@dataclass(frozen=True, slots=True)
class DowngradeApiVersions(RuleAction):
    """Advertise at most these versions in ApiVersions answers: api key -> max version."""

    max_versions: tuple[tuple[int, int], ...]

    kind: ClassVar[str] = "downgrade_api_versions"
    apis: ClassVar[frozenset[int] | None] = frozenset({API_VERSIONS})

    def __post_init__(self) -> None:
        if not self.max_versions:
            raise ValueError("name at least one api")

    @classmethod
    def read_body(cls, reader: NodeReader, body: yaml.Node | None, node: yaml.Node, path: str,
                  apis: frozenset[int] | None) -> RuleAction | Bad | None:
        """A map of api name -> max version, checked by name (not a mapping of fixed keys)."""
        if not isinstance(body, yaml.MappingNode):
            return reader.fail(body or node, path, "expected a map of api name to max version, e.g. {produce: 7}")
        out: list[tuple[int, int]] = []
        bad = False
        for key_node, value_node in body.value:
            name = str(key_node.value)
            key = reader.api(key_node, f"{path}.{name}")
            top = reader.integer(value_node, f"{path}.{name}", 0, 2**15 - 1)
            if isinstance(key, Bad) or isinstance(top, Bad):
                bad = True
                continue
            known = supported_versions(key)
            if known is not None and top < known[0]:
                bad = True
                reader.fail(value_node, f"{path}.{name}",
                            f"{api_snake_name(key)} has no version below {known[0]}; {top} would leave none")
                continue
            out.append((key, top))
        if bad:
            return BAD
        return reader.build(node, path, lambda: cls(tuple(out)))

    @property
    def edits_response(self) -> bool:
        return True

    def response_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                      ) -> Step | None:
        if api_key != API_VERSIONS:
            return None
        caps = dict(self.max_versions)
        return "downgrade_api_versions", lambda f: downgrade_api_versions(f, api_version, caps)
