"""One ``actions:`` entry of a rule, read from YAML nodes by its kind's own reader.

:class:`ActionReader` finds the kind by its YAML name in
:data:`~kproxy.rules.actions.registry.ACTION_KINDS`, checks the keys it takes and the apis it acts
on, and hands the rest to the kind's :meth:`~kproxy.rules.actions.base.RuleAction.read`, reporting
problems as :class:`~kproxy.rules.yaml_nodes.NodeReader` does. rules/README.md documents each kind.
"""

from __future__ import annotations

import yaml

from kproxy.protocol.codes import api_snake_name
from kproxy.rules.actions.base import RuleAction
from kproxy.rules.actions.registry import ACTION_KINDS
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader, did_you_mean


class ActionReader(NodeReader):
    """The action reader of the rules loader."""

    def action(self, node: yaml.Node, path: str, apis: frozenset[int] | None) -> RuleAction | Bad:
        """The action of one ``actions:`` entry of a rule whose ``match.api`` is ``apis`` (None: any)."""
        if isinstance(node, yaml.ScalarNode) and isinstance(self.scalar(node), str) and node.value in ACTION_KINDS:
            name, body = node.value, None  # a bare name: `- drop_response`
        elif isinstance(node, yaml.MappingNode) and len(node.value) == 1:
            key_node, body = node.value[0]
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else ""
            if name not in ACTION_KINDS:
                return self.fail(key_node, f"{path}.{name}",
                                 f"unknown action{did_you_mean(name, tuple(ACTION_KINDS))}")
        else:
            return self.fail(node, path, "an action is a mapping with one key, the action's name "
                                         "(e.g. '- delay: {ms: 100}')")
        kind = ACTION_KINDS[name]
        allowed = kind.apis
        if allowed is not None and (apis is None or not apis <= allowed):
            names = ", ".join(sorted(api_snake_name(k) for k in allowed))
            return self.fail(node, f"{path}.{name}", f"acts on {names} only: restrict match.api to them")
        apath = f"{path}.{name}"
        whole = kind.read_body(self, body, node, apath, apis)
        if whole is not None:
            return whole
        if body is None or (isinstance(body, yaml.ScalarNode) and body.tag == "tag:yaml.org,2002:null"):
            m: dict[str, yaml.Node] | None = {}
            at = node
        else:
            m = self.mapping(body, apath, kind.keys)
            at = body
        if m is None:
            return BAD
        return kind.read(self, m, at, apath, apis)


__all__ = ["ActionReader"]
