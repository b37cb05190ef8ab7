"""The ``rewrite_addresses`` action: rewrite broker endpoints in answers, beyond the default mapping.

YAML: ``- rewrite_addresses: {map: {"broker-1:9092": "elsewhere:9092"}}`` (exact ``host:port``
pairs) or ``{pattern: "^b(\\d+)\\.", replacement: "broker-\\1."}`` (an RE2 regex and its
replacement, :func:`~kproxy.rules.patterns.parse_replacement`'s syntax). Acts on every response
that carries endpoints (:func:`kproxy.protocol.endpoints.endpoint_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.host_port import parse_host_port, split_host_port
from kproxy.protocol.endpoints import EndpointMap, endpoint_fields, rewrite_endpoints
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.records import RecordBudget
from kproxy.rules.actions.base import RuleAction, Step
from kproxy.rules.patterns import Template, UserPattern, parse_replacement, substitute
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader

if TYPE_CHECKING:
    import yaml


@dataclass(frozen=True, slots=True)
class RewriteAddresses(RuleAction):
    """Beyond the default mapping: exact ``host:port`` pairs, or a host regex (RE2, compiled with its
    groups) and replacement (:func:`~kproxy.rules.patterns.parse_replacement`'s syntax)."""

    mapping: tuple[tuple[str, str], ...] = ()
    pattern: UserPattern | None = None
    replacement: str | None = None
    template: Template = field(default=(), init=False, repr=False, compare=False)

    kind: ClassVar[str] = "rewrite_addresses"
    keys: ClassVar[tuple[str, ...]] = ("map", "pattern", "replacement")

    def __post_init__(self) -> None:
        if bool(self.mapping) == (self.pattern is not None):
            raise ValueError("give either map or pattern (with replacement)")
        if (self.pattern is None) != (self.replacement is None):
            raise ValueError("pattern and replacement go together")
        if self.pattern is not None and self.replacement is not None:
            object.__setattr__(self, "template", parse_replacement(self.pattern, self.replacement))

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        if "map" in m:
            pairs = reader.string_map(m["map"], f"{path}.map", lambda n, p, t: _host_port(reader, n, p, t))
            kw["mapping"] = pairs if isinstance(pairs, Bad) else tuple(pairs)
        if "pattern" in m:
            kw["pattern"] = reader.regex(m["pattern"], f"{path}.pattern", captures=True)
        if "replacement" in m:
            kw["replacement"] = reader.string(m["replacement"], f"{path}.replacement")
            pattern, replacement = kw.get("pattern"), kw["replacement"]
            if isinstance(pattern, UserPattern) and isinstance(replacement, str):
                # Checked here for the replacement's own line (the model checks it again).
                checked = reader.build(m["replacement"], f"{path}.replacement",
                                       lambda: parse_replacement(pattern, replacement))
                kw["replacement"] = BAD if isinstance(checked, Bad) else replacement
        return reader.made(at, path, kw, cls)

    @property
    def edits_response(self) -> bool:
        return True

    def response_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                      ) -> Step | None:
        if endpoint_fields(api_key, api_version) is None:
            return None
        mapping = address_map(self)
        return "rewrite_addresses", lambda f: rewrite_endpoints(f, api_key, api_version, mapping)


def _host_port(reader: NodeReader, node: yaml.Node, path: str, text: str) -> str | Bad:
    try:
        parse_host_port(text)
    except ValueError as exc:
        return reader.fail(node, path, str(exc))
    return text


def address_map(action: RewriteAddresses) -> EndpointMap:
    """The endpoint mapping of a ``rewrite_addresses`` action.

    ``map``: exact ``host:port`` -> ``host:port``. ``pattern``: an RE2 regex whose every
    match in the ``host:port`` text of an endpoint is replaced (groups inserted with ``\\1`` or
    ``\\g<name>``: :func:`~kproxy.rules.patterns.parse_replacement`); a result without a port
    keeps the endpoint's port.
    """
    if action.pattern is None:
        table: dict[tuple[str, int | None], tuple[str, int | None]] = {
            split_host_port(k): split_host_port(v) for k, v in action.mapping}

        def by_table(host: str, port: int) -> tuple[str, int] | None:
            found = table.get((host, port))
            if found is None:
                return None
            return found[0], port if found[1] is None else found[1]

        return by_table
    pattern, template = action.pattern, action.template

    def by_pattern(host: str, port: int) -> tuple[str, int] | None:
        text = f"{host}:{port}"
        new = substitute(pattern, template, text)
        if new == text:
            return None
        new_host, new_port = split_host_port(new)
        return new_host, port if new_port is None else new_port

    return by_pattern
