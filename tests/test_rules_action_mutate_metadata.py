"""The ``mutate_metadata`` action (kproxy/rules/actions/mutate_metadata.py) through its interface:
its reader, its edits of real Metadata answers, and the leader epochs it raises (the policy keeps
them as floors: tests/test_leader_epochs_policy.py). The edits themselves:
tests/test_protocol_mutations.py; with real clients: tests/test_rules_metadata_clients.py."""

from __future__ import annotations

from kproxy.policy.injector import RulePlan
from kproxy.protocol.topic_ids import TopicIdNames
from kproxy.rules import load_text
from kproxy.rules.apply import apply_to_response
from tests.test_protocol_mutations import metadata_frame
from tests.test_rules_apply import METADATA, actions, response_body


def test_mutate_metadata_from_a_rule_file() -> None:
    acts = actions("""
        - mutate_metadata:
            hide_brokers: [3]
            move_leader: [{topic: orders, partition: 0, to: 2}]
            shrink_isr: [{topic: orders, partition: 1, to: [2]}]
            hide_partitions: [{topic: other, partition: 2}]
        """, "{api: metadata}")
    out = apply_to_response(acts, metadata_frame(12), METADATA, 12)
    body = response_body(METADATA, 12, out.frame)
    assert [b["node_id"] for b in body["brokers"]] == [1, 2]
    orders = body["topics"][0]["partitions"]
    assert [p["leader_id"] for p in orders] == [2, 2, -1]
    assert orders[1]["isr_nodes"] == [2]
    other = body["topics"][1]["partitions"]
    assert [(p["partition_index"], p["leader_id"], p["error_code"]) for p in other][2] == (2, -1, 5)


def test_the_policy_learns_the_leader_epochs_it_raises_from_the_action() -> None:
    """``move_leader`` raises the partitions' leader epochs: the rule's plan asks the actions
    (RuleAction.leader_moves), which the policy then floors; actions that raise none say so."""
    rule_set = load_text("""rules:
  - id: r
    match: {api: metadata}
    actions:
      - mutate_metadata: {move_leader: [{topic: orders, partition: 0, to: 2}, {topic: logs, partition: 3, to: 1}]}
      - delay: {ms: 1}
""")
    (rule,) = rule_set.rules
    moving, delay = rule.actions
    assert moving.leader_moves == frozenset({("orders", 0), ("logs", 3)}) and delay.leader_moves == frozenset()
    assert RulePlan(rule, TopicIdNames()).leader_moves == frozenset({("orders", 0), ("logs", 3)})
    hiding = actions("- mutate_metadata: {hide_brokers: [3]}", "{api: metadata}")[0]
    assert hiding.leader_moves == frozenset()
