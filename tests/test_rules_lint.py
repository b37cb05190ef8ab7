"""Rules that load but can never act (kproxy/rules/lint.py): ``kproxy rules check`` warns at their
line and exits 0. A shadowing warning is checked against the engine itself: the requests the
shadowed rule matches are decided by the earlier rule."""

from __future__ import annotations

import ipaddress
import pathlib
import textwrap

import pytest

from kproxy.cli import main
from kproxy.protocol.codes import ApiKey
from kproxy.rules import RuleEngine, StaticFacts, load_text
from kproxy.rules.lint import warnings_of_text


def _warnings(text: str) -> list[str]:
    return [f"{w.line}: {w.key}: {w.reason}" for w in warnings_of_text(textwrap.dedent(text), "r.yaml")]


SHADOWED = """\
    rules:
      - id: all-produce
        match: {api: produce}
        actions: [{delay: {ms: 10}}]
      - id: orders-errors
        match:
          api: produce
          topic: "orders-*"
        actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
    """


def test_a_rule_behind_a_catch_all_that_stops_evaluation_is_reported_at_its_line(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chaos.yaml"
    path.write_text(textwrap.dedent(SHADOWED))
    assert main(["rules", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: ok\n"
    assert err.splitlines() == [
        f"{path}:5: warning: rules[1]: rule 'orders-errors' is shadowed by rules[0] ('all-produce', {path}:2): "
        "that rule matches every request this one matches and stops evaluation (no 'continue: true'), so this "
        "one never acts"]
    # What the engine does: the shadowed rule's requests are all-produce's.
    engine = RuleEngine(load_text(textwrap.dedent(SHADOWED)))
    decision = engine.evaluate(StaticFacts(api_key=ApiKey.PRODUCE, api_version=9,
                                           topic_partitions={"orders-eu": frozenset({0})}))
    assert [hit.rule_id for hit in decision.hits] == ["all-produce"]


@pytest.mark.parametrize("first", [
    "{api: produce}\n    continue: true",  # goes on to later rules
    "{api: produce, probability: 0.5}",  # misses some requests
    "{api: produce, schedule: {first: 3}}",
    "{api: produce}\n    enabled: false",
    "{api: produce, topic: 'orders-eu'}",  # narrower than the later rule
    "{api: produce, client_id: 'batch-.*'}",
    "{api: [produce], acks: [-1]}",
    "{api: produce, api_version: {min: 3}}",
    "{api: produce, partition: [0, 1]}",
    "{api: produce, client_address: 10.0.0.0/8}",
])
def test_an_earlier_rule_that_may_let_requests_through_shadows_nothing(first: str) -> None:
    text = f"""\
rules:
  - id: first
    match: {first}
    actions: [{{delay: {{ms: 1}}}}]
  - id: second
    match: {{api: produce, topic: "orders-*"}}
    actions: [{{delay: {{ms: 2}}}}]
"""
    assert warnings_of_text(text) == []


@pytest.mark.parametrize(("first", "second"), [
    ("{}", "{api: fetch}"),  # match: {} stops everything
    ("{topic: 'orders-*'}", "{api: produce, topic: orders-eu}"),  # a glob covering a literal name
    ("{topic: {regex: '.*'}}", "{api: produce, topic: x}"),
    ("{client_id: 'batch-.*'}", "{client_id: batch-7, api: fetch}"),
    ("{api: [produce, fetch], api_version: {min: 3}}", "{api: fetch, api_version: {min: 4, max: 9}}"),
    ("{client_address: 10.0.0.0/8}", "{client_address: [10.1.0.0/16, 10.2.3.4]}"),
    ("{partition: [0, 1, 2]}", "{api: produce, partition: 1, topic: t}"),
    ("{principal: '.*'}", "{principal: alice}"),
    ("{api: produce, acks: [all, 1]}", "{api: produce, acks: all, probability: 0.1}"),
    ("{api: produce}\n    dry_run: true", "{api: produce}"),  # a dry run's hit stops evaluation too
])
def test_an_earlier_rule_covering_every_key_shadows(first: str, second: str) -> None:
    text = f"""\
rules:
  - id: first
    match: {first}
    actions: [{{delay: {{ms: 1}}}}]
  - id: second
    match: {second}
    actions: [{{delay: {{ms: 2}}}}]
"""
    found = warnings_of_text(text)
    assert [(w.key, w.line) for w in found] == [("rules[1]", text.splitlines().index("  - id: second") + 1)], found
    assert "rule 'second' is shadowed by rules[0] ('first'" in found[0].reason


@pytest.mark.parametrize(("first", "second"), [
    ("{topic: '*'}", "{api: produce}"),  # a request naming no topic passes no topic key
    ("{client_id: '.*'}", "{api: produce}"),  # nor a client without an id a client_id key
    ("{topic: 'orders-*'}", "{topic: 'order*'}"),  # globs: cannot tell, so no claim
    ("{client_address: 10.0.0.0/16}", "{client_address: 10.0.0.0/8}"),
    ("{api: fetch, api_version: {max: 11}}", "{api: fetch}"),
])
def test_a_key_that_does_not_cover_the_later_rules_shadows_nothing(first: str, second: str) -> None:
    text = f"""\
rules:
  - id: first
    match: {first}
    actions: [{{delay: {{ms: 1}}}}]
  - id: second
    match: {second}
    actions: [{{delay: {{ms: 2}}}}]
"""
    assert warnings_of_text(text) == []


def test_keys_an_api_does_not_carry_are_reported_at_the_key() -> None:
    assert _warnings("""\
        rules:
          - id: group-of-metadata
            match:
              api: [metadata, join_group]
              group_id: "g-.*"
            actions: [{delay: {ms: 5}}]
          - id: topic-of-a-coordinator
            match: {api: find_coordinator, topic: orders}
            actions: [{delay: {ms: 5}}]
          - id: partition-of-metadata
            match:
              api: metadata
              partition: 0
            actions: [{delay: {ms: 5}}]
          - id: txn-of-fetch
            match: {api: fetch, transactional_id: t-1}
            actions: [{delay: {ms: 5}}]
          - id: fetch-from-the-future
            match:
              api: fetch
              api_version: {min: 400}
            actions: [{delay: {ms: 5}}]
          - id: old-delete-topics
            match:
              api: delete_topics
              api_version: {max: 5}
              topic: orders
            actions: [{delay: {ms: 5}}]
        """) == [
        "5: rules[0].match.group_id: metadata requests carry no group id: rule 'group-of-metadata' never matches them",
        "8: rules[1].match.topic: find_coordinator requests name no topic: rule 'topic-of-a-coordinator' never "
        "matches them",
        "13: rules[2].match.partition: metadata requests name no partition: rule 'partition-of-metadata' never "
        "matches them",
        "16: rules[3].match.transactional_id: fetch requests carry no transactional id: rule 'txn-of-fetch' never "
        "matches them",
        f"21: rules[4].match.api_version: fetch requests are v0-v{_max_version(ApiKey.FETCH)} (the versions kproxy "
        "knows): rule 'fetch-from-the-future' never matches them",
        "27: rules[5].match.topic: delete_topics requests v0-v5 name no topic: rule 'old-delete-topics' never "
        "matches them",
    ]


def _max_version(api: int) -> int:
    from kproxy.protocol.message_schemas import supported_versions

    known = supported_versions(api)
    assert known is not None
    return known[1]


def test_keys_the_api_carries_raise_nothing() -> None:
    assert _warnings("""\
        rules:
          - id: a
            match: {api: [join_group, offset_commit, find_coordinator], group_id: "g-.*"}
            actions: [{delay: {ms: 5}}]
          - id: b
            match: {api: [produce, init_producer_id], transactional_id: "t-.*"}
            actions: [{delay: {ms: 5}}]
          - id: c
            match: {api: [produce, fetch, metadata, delete_topics], topic: orders}
            actions: [{delay: {ms: 5}}]
          - id: d
            match: {api: [produce, list_offsets], partition: 3, api_version: {max: 7}}
            actions: [{delay: {ms: 5}}]
        """) == []


def test_shadowing_across_the_files_of_a_directory_names_the_other_file(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "00-base.yaml").write_text("rules:\n  - id: all-fetch\n    match: {api: fetch}\n"
                                           "    actions: [drop_response]\n")
    (tmp_path / "10-more.yaml").write_text("rules:\n  - id: fetch-eu\n    match: {api: fetch, topic: eu}\n"
                                           "    actions: [{delay: {ms: 5}}]\n")
    (tmp_path / "20-broken.yaml").write_text("rules: [{id: x}]\n")
    assert main(["rules", "check", str(tmp_path / "10-more.yaml"), str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    # The directory does not load (20-broken.yaml): its problems, and no warning of it; the file alone loads.
    assert all(line.startswith(f"{tmp_path / '20-broken.yaml'}:1: ") for line in err if "warning" not in line), err
    assert not [line for line in err if "warning" in line]
    (tmp_path / "20-broken.yaml").unlink()
    assert main(["rules", "check", str(tmp_path)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"{tmp_path / '10-more.yaml'}:2: warning: rules[0]: rule 'fetch-eu' is shadowed by rules[0] ('all-fetch', "
        f"{tmp_path / '00-base.yaml'}:2): that rule matches every request this one matches and stops evaluation "
        "(no 'continue: true'), so this one never acts"]


FIRST = """\
  - id: first
    match: {client_id: 'batch-.*', client_address: 10.0.0.0/8, topic: 'orders-*', partition: [0, 1, 2]}
    actions: [{delay: {ms: 1}}]
"""
SECOND = """\
  - id: second
    match: {client_id: batch-7, client_address: 10.2.3.4, topic: orders-eu, partition: 1, api: fetch,
            api_version: {min: 4, max: 9}, principal: alice}
    actions: [{delay: {ms: 2}}]
"""


def test_a_shadowing_the_lint_claims_is_the_engines() -> None:
    """A rule the lint says is shadowed on every key at once: a request it matches when alone is
    decided by the earlier rule when both are loaded."""
    both = "rules:\n" + FIRST + SECOND
    assert [w.key for w in warnings_of_text(both)] == ["rules[1]"]
    facts = StaticFacts(api_key=ApiKey.FETCH, api_version=5, client_id="batch-7",
                        client_ip=ipaddress.ip_address("10.2.3.4"), principal="User:alice",
                        topic_partitions={"orders-eu": frozenset({1})})
    assert [h.rule_id for h in RuleEngine(load_text("rules:\n" + SECOND)).evaluate(facts).hits] == ["second"]
    assert [h.rule_id for h in RuleEngine(load_text(both)).evaluate(facts).hits] == ["first"]
