"""Rule files: the examples load and validate; bad files are rejected precisely, by the loader and the schema."""

from __future__ import annotations

import json
import pathlib
import textwrap

import jsonschema
import pytest
import yaml

from kproxy.cli import main
from kproxy.protocol import _tables
from kproxy.protocol.codes import api_snake_name
from kproxy.rules import RulesError, load_file, load_text
from kproxy.rules.actions.delay import Delay
from kproxy.rules.actions.downgrade_api_versions import DowngradeApiVersions
from kproxy.rules.actions.inject_error import InjectError, InjectMode
from kproxy.rules.actions.mutate_metadata import MutateMetadata, PartitionRef
from kproxy.rules.actions.throttle import (
    Throttle,
    ThrottleScope,
)
from kproxy.rules.patterns import MAX_PATTERN_CHARS, MAX_PATTERN_MEMORY, SYNTAX_HINT

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "rules" / "examples").glob("*.yaml"))
SCHEMA = json.loads((ROOT / "rules" / "kproxy-rules.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def schema_errors(text: str) -> list[str]:
    return [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(text))]


def problems(text: str) -> list[str]:
    with pytest.raises(RulesError) as caught:
        load_text(textwrap.dedent(text), "r.yaml")
    return [str(p) for p in caught.value.problems]


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_the_schema_names_every_error_and_api_of_the_tables() -> None:
    errors = SCHEMA["$defs"]["inject_error"]["properties"]["error"]["oneOf"][0]["enum"]
    assert sorted(errors) == sorted(name for code, (name, _) in _tables.ERRORS.items() if code != 0)
    apis = SCHEMA["$defs"]["match"]["properties"]["api"]["oneOf"][0]["oneOf"][0]["enum"]
    assert sorted(apis) == sorted(api_snake_name(k) for k in _tables.API_NAMES)


def test_every_scenario_has_an_example() -> None:
    names = {p.stem for p in EXAMPLES}
    assert names >= {"leader-election-storm", "slow-broker", "produce-errors-one-topic",
                     "consumer-group-rebalance-chaos", "quota-throttling", "broken-broker",
                     "duplicated-and-corrupted-records", "hidden-broker", "protocol-downgrade"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads_and_validates(path: pathlib.Path) -> None:
    text = path.read_text()
    assert text.startswith("# "), "each example starts by saying what a client should do"
    assert "What a well-behaved client does" in text
    rules = load_file(str(path))
    assert rules.rules and rules.source == str(path)
    assert schema_errors(text) == []


def test_the_issue_example_loads_to_these_values() -> None:
    rules = load_text(textwrap.dedent("""\
        seed: 42
        rules:
          - id: orders-not-leader
            match: {api: produce, topic: "orders-*", probability: 0.3}
            actions:
              - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
          - id: slow-fetch
            match: {api: fetch}
            actions:
              - delay: {ms: 200, jitter_ms: 50}
          - id: quota
            match: {client_id: "batch-.*"}
            actions:
              - throttle: {bytes_per_second: 1048576}
        """))
    assert rules.seed == 42
    first, second, third = rules.rules
    assert first.match.apis == frozenset({0}) and first.match.probability == 0.3
    assert first.match.topics is not None and first.match.topics[0].matches("orders-eu")
    assert not first.match.topics[0].matches("xorders-eu")
    assert first.actions == (InjectError(6, mode=InjectMode.RESPOND),)
    assert second.actions == (Delay(200, 50),)
    assert third.match.apis is None and third.match.client_id is not None
    assert third.actions == (Throttle(bytes_per_second=1048576, scope=ThrottleScope.CLIENT_ID),)


def test_numbers_names_and_lists_are_all_accepted() -> None:
    rules = load_text(textwrap.dedent("""\
        rules:
          - id: a
            match: {api: [0, Fetch, list_offsets], api_version: {min: 3}, acks: [all, 1], partition: [0, 2],
                    client_address: ["10.0.0.0/8", "::1"], broker_id: 3,
                    schedule: {window: {start: "22:00", end: 6:00}}}
            actions: [{inject_error: {error: 6, partitions: 1, mode: replace}}, {delay: {ms: 1}}]
          - id: b
            match: {api: metadata}
            actions:
              - mutate_metadata: {hide_brokers: 2, move_leader: [{topic: t, partition: 0, to: 1}]}
          - id: c
            match: {api: api_versions}
            actions: [{downgrade_api_versions: {produce: 7, Fetch: 11}}]
        """))
    a, b, c = rules.rules
    assert a.match.apis == frozenset({0, 1, 2}) and a.match.min_version == 3 and a.match.max_version is None
    assert a.match.acks == frozenset({-1, 1})
    assert a.match.schedule is not None and a.match.schedule.window is not None
    # An unquoted 6:00 is the base-60 integer 360 to YAML 1.1: the loader reads the text as written.
    assert (a.match.schedule.window.start_s, a.match.schedule.window.end_s) == (22 * 3600, 6 * 3600)
    assert a.actions[0] == InjectError(6, partitions=frozenset({1}), mode=InjectMode.REPLACE)
    assert b.actions == (MutateMetadata(hide_brokers=frozenset({2}), move_leader=((PartitionRef("t", 0), 1),)),)
    assert c.actions == (DowngradeApiVersions(((0, 7), (1, 11))),)


# Each bad file: its text, the exact problems the loader reports, and whether the JSON Schema can see
# it too (a schema cannot check unique ids, nor which APIs an action acts on).
BAD_FILES: list[tuple[str, str, list[str], bool]] = [
    # Found by the rules_yaml/rules_json fuzz targets: each raised out of the loader (tests/fuzz/regressions).
    ("a file that is a bare '='", "=\n", ["r.yaml:1: (top): expected a mapping, got an untyped value '='"], False),
    ("a file that is one word", "hello\n", ["r.yaml:1: (top): expected a mapping, got a string 'hello'"], True),
    ("a local tag", """\
        seed: !pi 3
        rules: []
        """, ["r.yaml:1: seed: expected an integer, got an untyped value '3' (tag !pi)"], False),
    ("a hidden partition without its partition", """\
        rules:
          - id: a
            match: {api: metadata}
            actions:
              - mutate_metadata: {hide_partitions: [{topic: t}]}
        """, ["r.yaml:5: rules[0].actions[0].mutate_metadata.hide_partitions[0].partition: missing"], True),
    ("unknown top key", """\
        seed: 1
        rulez: []
        """, ["r.yaml:2: rulez: unknown key (did you mean 'rules'?)", "r.yaml:1: rules: missing (a list of rules)"],
     True),
    ("unknown rule key", """\
        rules:
          - id: a
            mach: {}
            actions: [drop_response]
        """, ["r.yaml:2: rules[0].match: missing (use 'match: {}' to match every request)",
              "r.yaml:3: rules[0].mach: unknown key (did you mean 'match'?)"], True),
    ("unknown match key", """\
        rules:
          - id: a
            match: {api: produce, topik: orders}
            actions: [drop_response]
        """, ["r.yaml:3: rules[0].match.topik: unknown key (did you mean 'topic'?)"], True),
    ("unknown action", """\
        rules:
          - id: a
            match: {}
            actions:
              - injectt_error: {error: 6}
        """, ["r.yaml:5: rules[0].actions[0].injectt_error: unknown action (did you mean 'inject_error'?)"], True),
    ("unknown action key", """\
        rules:
          - id: a
            match: {}
            actions:
              - delay: {ms: 5, jiter_ms: 1}
        """, ["r.yaml:5: rules[0].actions[0].delay.jiter_ms: unknown key (did you mean 'jitter_ms'?)"], True),
    ("wrong types", """\
        seed: "x"
        rules:
          - id: a
            enabled: "yes please"
            match: {api: produce, probability: high}
            actions:
              - delay: {ms: soon}
        """, ["r.yaml:1: seed: expected an integer, got a string 'x'",
              "r.yaml:4: rules[0].enabled: expected true or false, got a string 'yes please'",
              "r.yaml:5: rules[0].match.probability: expected a number, got a string 'high'",
              "r.yaml:7: rules[0].actions[0].delay.ms: expected a number, got a string 'soon'"], True),
    ("rules not a list", """\
        rules: {id: a}
        """, ["r.yaml:1: rules: expected a list, got a mapping"], True),
    ("unknown error name", """\
        rules:
          - id: a
            match: {api: produce}
            actions:
              - inject_error: {error: NOT_LEADER_FOR_PARTITON}
        """, ["r.yaml:5: rules[0].actions[0].inject_error.error: unknown Kafka error 'NOT_LEADER_FOR_PARTITON' "
              "(did you mean 'NOT_LEADER_OR_FOLLOWER'?)"], True),
    ("error NONE", """\
        rules:
          - id: a
            match: {}
            actions: [{inject_error: {error: NONE}}]
        """, ["r.yaml:4: rules[0].actions[0].inject_error.error: NONE (0) is not an error"], True),
    ("unknown api name", """\
        rules:
          - id: a
            match: {api: [produce, fetsh]}
            actions: [drop_response]
        """, ["r.yaml:3: rules[0].match.api[1]: unknown api 'fetsh' (did you mean 'fetch'?)"], True),
    ("bad regexes", """\
        rules:
          - id: a
            match: {client_id: "batch-(", topic: {regex: "[orders"}}
            actions: [drop_response]
        """, ["r.yaml:3: rules[0].match.client_id: bad regex: missing ): batch-(",
              "r.yaml:3: rules[0].match.topic.regex: bad regex: missing ]: [orders"], True),
    # RE2 matches in linear time, so it has no backtracking features: each is refused at its own line,
    # saying what it is. The schema's "regex" format (ECMA-262) takes them: only the loader can tell.
    ("patterns RE2 refuses", r"""
        rules:
          - id: a
            match:
              client_id: "(a)\\1"
              group_id: "orders(?=-eu)"
              transactional_id: "tx-\\d*+"
              topic: [{regex: "pay\\Z"}, {regex: "(?<=x)y"}]
            actions: [drop_response]
          - id: b
            match: {api: metadata}
            actions: [{rewrite_addresses: {pattern: "(?>broker)-(\\d+)", replacement: "b\\1"}}]
        """, [f"r.yaml:5: rules[0].match.client_id: bad regex: invalid escape sequence: \\1 (backreferences are "
              f"not supported: {SYNTAX_HINT})",
              f"r.yaml:6: rules[0].match.group_id: bad regex: invalid perl operator: (?= (lookahead is not "
              f"supported: {SYNTAX_HINT})",
              f"r.yaml:7: rules[0].match.transactional_id: bad regex: bad repetition operator: *+ (possessive "
              f"quantifiers are not supported: {SYNTAX_HINT})",
              f"r.yaml:8: rules[0].match.topic[0].regex: bad regex: invalid escape sequence: \\Z (write \\z for "
              f"the end of the text: {SYNTAX_HINT})",
              f"r.yaml:8: rules[0].match.topic[1].regex: bad regex: invalid perl operator: (?<= (lookbehind is not "
              f"supported: {SYNTAX_HINT})",
              f"r.yaml:12: rules[1].actions[0].rewrite_addresses.pattern: bad regex: invalid perl operator: (?> "
              f"(atomic groups are not supported: {SYNTAX_HINT})"], False),
    ("patterns too big or meaning something else to RE2", f"""\
        rules:
          - id: a
            match:
              client_id: "{'x' * (MAX_PATTERN_CHARS + 1)}"
              group_id: "(\\\\pL{{1000}})"
              topic: "{'t' * (MAX_PATTERN_CHARS + 1)}"
              transactional_id: "tx-a{{,3}}"
            actions: [drop_response]
        """, [f"r.yaml:4: rules[0].match.client_id: bad regex: pattern is {MAX_PATTERN_CHARS + 1} characters, "
              f"more than the {MAX_PATTERN_CHARS} allowed",
              f"r.yaml:5: rules[0].match.group_id: bad regex: pattern too large - compile failed (the compiled "
              f"pattern would need more than {MAX_PATTERN_MEMORY} bytes)",
              f"r.yaml:6: rules[0].match.topic: glob is {MAX_PATTERN_CHARS + 1} characters, "
              f"more than the {MAX_PATTERN_CHARS} allowed",
              "r.yaml:7: rules[0].match.transactional_id: bad regex: x{,n} is literal text in RE2, not a "
              "repetition: write x{0,n}"], True),
    ("a replacement naming a group the pattern lacks", r"""
        rules:
          - id: a
            match: {api: metadata}
            actions:
              - rewrite_addresses: {pattern: "(?P<host>[a-z]+):9092", replacement: '\g<name>:19092'}
              - rewrite_addresses: {pattern: "([a-z]+):9092", replacement: '\2:19092'}
              - rewrite_addresses: {pattern: "([a-z]+):9092", replacement: '\n\1'}
        """, ["r.yaml:6: rules[0].actions[0].rewrite_addresses.replacement: the replacement names group 'name', "
              "which the pattern does not have (1 groups)",
              "r.yaml:7: rules[0].actions[1].rewrite_addresses.replacement: the replacement names group '2', "
              "which the pattern does not have (1 groups)",
              "r.yaml:8: rules[0].actions[2].rewrite_addresses.replacement: bad escape at character 0 of the "
              "replacement: only \\1..\\99, \\g<name> and \\\\ are allowed"], False),
    # Numbers that would overflow at run time (a throttle of 5e-324 bytes/s held a request for inf
    # seconds and round(inf) ended the connection) are refused, each at its own line.
    ("rates and durations out of range", """\
        rules:
          - id: a
            match: {}
            actions:
              - throttle: {bytes_per_second: 5.0e-324, requests_per_second: 0.0001, burst_seconds: 1.0e+300}
              - throttle:
                  bytes_per_second: 1.0e+16
              - delay: {ms: 1.0e+300, jitter_ms: 604800001}
              - slow_close: {delay_ms: 1.0e+308}
        """, ["r.yaml:5: rules[0].actions[0].throttle.bytes_per_second: must be >= 1, got 5e-324",
              "r.yaml:5: rules[0].actions[0].throttle.requests_per_second: must be >= 0.001, got 0.0001",
              "r.yaml:5: rules[0].actions[0].throttle.burst_seconds: must be <= 604800, got 1e+300",
              "r.yaml:7: rules[0].actions[1].throttle.bytes_per_second: must be <= 1e+15, got 1e+16",
              "r.yaml:8: rules[0].actions[2].delay.ms: must be <= 6.048e+08, got 1e+300",
              "r.yaml:8: rules[0].actions[2].delay.jitter_ms: must be <= 6.048e+08, got 604800001",
              "r.yaml:9: rules[0].actions[3].slow_close.delay_ms: must be <= 6.048e+08, got 1e+308"], True),
    ("bad CIDR", """\
        rules:
          - id: a
            match:
              client_address: [10.0.0.0/33, 10.1.0.0/16]
            actions: [drop_response]
        """, ["r.yaml:4: rules[0].match.client_address[0]: not an address or CIDR block: "
              "'10.0.0.0/33' does not appear to be an IPv4 or IPv6 network"], True),
    ("impossible schedules", """\
        rules:
          - id: a
            match: {schedule: {first: 0, every: 0}}
            actions: [drop_response]
          - id: b
            match:
              schedule: {for_seconds: 0, window: {start: "10:00", end: "10:00"}}
            actions: [drop_response]
        """, ["r.yaml:3: rules[0].match.schedule.first: first must be >= 1 (first: 0 never matches)",
              "r.yaml:3: rules[0].match.schedule.every: must be >= 1, got 0",
              "r.yaml:7: rules[1].match.schedule.for_seconds: for_seconds must be > 0 (a zero duration never matches)",
              "r.yaml:7: rules[1].match.schedule.window: an empty window never matches (start equals end)"], True),
    ("empty time window", """\
        rules:
          - id: a
            match: {schedule: {window: {start: "10:00", end: "10:00:00"}}}
            actions: [drop_response]
        """, ["r.yaml:3: rules[0].match.schedule.window: an empty window never matches (start equals end)"], False),
    ("probability out of range", """\
        rules:
          - id: a
            match: {probability: 1.5}
            actions: [drop_response]
        """, ["r.yaml:3: rules[0].match.probability: probability must be in (0, 1]"], True),
    ("duplicate ids", """\
        rules:
          - id: a
            match: {}
            actions: [drop_response]
          - id: a
            match: {}
            actions: [blackhole]
        """, ["r.yaml:5: rules[1].id: duplicate rule id 'a' (first at line 2)"], False),
    ("action on the wrong api", """\
        rules:
          - id: a
            match: {api: metadata}
            actions: [{corrupt_records: {target: crc}}]
        """, ["r.yaml:4: rules[0].actions[0].corrupt_records: acts on fetch, produce only: "
              "restrict match.api to them"], False),
    ("partial produce failure answered locally", """\
        rules:
          - id: a
            match: {api: [produce, fetch]}
            actions: [{inject_error: {error: NOT_ENOUGH_REPLICAS, partitions: [0]}}]
        """, ["r.yaml:4: rules[0].actions[0].inject_error.partitions: a partial Produce failure needs mode: replace "
              "(answering without forwarding would acknowledge records that were never written)"], False),
    ("rewrite of a field the api does not have", """\
        rules:
          - id: a
            match: {api: produce}
            actions:
              - rewrite: {set: {ack: 1, "topic_data[].name": x, "topic_data.name": y}}
        """, ["r.yaml:5: rules[0].actions[0].rewrite.set.ack: no field 'ack' in produce requests of any version "
              "(arrays end in []) (did you mean 'acks'?)",
              "r.yaml:5: rules[0].actions[0].rewrite.set.topic_data.name: no field 'topic_data.name' in produce "
              "requests of any version (arrays end in []) (did you mean 'topic_data'?)"], False),
    ("no actions", """\
        rules:
          - id: a
            match: {}
            actions: []
        """, ["r.yaml:4: rules[0].actions: empty: a rule needs at least one action"], True),
    ("bad enum value", """\
        rules:
          - id: a
            match: {}
            actions: [{throttle: {bytes_per_second: 10, scope: per_client}}]
        """, ["r.yaml:4: rules[0].actions[0].throttle.scope: expected one of client_id, principal, topic, global, "
              "got 'per_client' (did you mean 'client_id'?)"], True),
    ("downgrade below the minimum", """\
        rules:
          - id: a
            match: {api: api_versions}
            actions: [{downgrade_api_versions: {produce: -1, fetchh: 3}}]
        """, ["r.yaml:4: rules[0].actions[0].downgrade_api_versions.produce: must be >= 0, got -1",
              "r.yaml:4: rules[0].actions[0].downgrade_api_versions.fetchh: unknown api 'fetchh' "
              "(did you mean 'fetch'?)"], True),
    ("yaml syntax", """\
        rules:
          - id: a
            match: {api: produce
            actions: []
        """, ["r.yaml:4: (yaml): expected ',' or '}', but got ':'"], True),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e, _ in BAD_FILES],
                         ids=[name for name, *_ in BAD_FILES])
def test_bad_file_rejected_with_every_problem(text: str, expected: list[str]) -> None:
    assert sorted(problems(text)) == sorted(expected)


@pytest.mark.parametrize(("text", "schema_sees_it"), [(t, s) for _, t, _, s in BAD_FILES],
                         ids=[name for name, *_ in BAD_FILES])
def test_schema_agrees_with_the_loader(text: str, schema_sees_it: bool) -> None:
    """Every bad file the schema can judge, it rejects too (the rest need the loader's checks)."""
    try:
        errors = schema_errors(textwrap.dedent(text))
    except yaml.YAMLError:
        return  # not YAML: nothing for a schema to validate
    assert bool(errors) == schema_sees_it, errors


def test_problems_come_in_file_order_with_the_file_name(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "chaos.yaml"
    path.write_text("rules:\n  - id: a\n    match: {api: x}\n    actions: [nope]\n")
    with pytest.raises(RulesError) as caught:
        load_file(str(path))
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:3: rules[0].match.api: unknown api 'x'",
        f"{path}:4: rules[0].actions[0]: an action is a mapping with one key, the action's name "
        "(e.g. '- delay: {ms: 100}')"]


# -- kproxy rules check ------------------------------------------------------------------------
def test_rules_check_exits_0_for_valid_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "check", *map(str, EXAMPLES)]) == 0
    assert capsys.readouterr().out.count(": ok\n") == len(EXAMPLES)


def test_rules_check_exits_2_listing_every_problem_of_every_file(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text("rules:\n  - id: a\n    match: {api: fech}\n    actions: [{delay: {ms: -1}}]\n")
    two.write_text("rules:\n  - id: b\n    match: {}\n    actions: [{inject_error: {error: NOT_COORDINATR}}]\n")
    assert main(["rules", "check", str(EXAMPLES[0]), str(one), str(two), str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{one}:3: rules[0].match.api: unknown api 'fech' (did you mean 'fetch'?)",
        f"{one}:4: rules[0].actions[0].delay.ms: must be >= 0, got -1",
        f"{two}:4: rules[0].actions[0].inject_error.error: unknown Kafka error 'NOT_COORDINATR' "
        "(did you mean 'NOT_COORDINATOR'?)",
        f"{tmp_path / 'missing.yaml'}:0: (file): cannot read: No such file or directory",
    ]


def test_rules_check_reads_a_directory_as_kproxy_run_does(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ConfigMap mounted as a directory: its files merged, a rule id repeated across them refused."""
    (tmp_path / "00-base.yaml").write_text("rules:\n  - id: a\n    match: {api: fetch}\n    actions: [drop_response]\n")
    (tmp_path / "10-more.yaml").write_text("rules:\n  - id: b\n    match: {}\n    actions: [{delay: {ms: 5}}]\n")
    assert main(["rules", "check", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{tmp_path}: ok\n"
    (tmp_path / "20-again.yaml").write_text("rules:\n  - id: a\n    match: {}\n    actions: [drop_response]\n")
    assert main(["rules", "check", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"{tmp_path / '20-again.yaml'}:2: ") and "'a'" in err[0], err
