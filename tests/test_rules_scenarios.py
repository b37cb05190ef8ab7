"""Scenarios of issue 36's second half, sans-IO: each key read by the loader (and ``rules check``),
checked by the editors' schema, honoured by a real Session through the policy, by the what-if's
evaluator over captured records, and shown by the admin listing.

Time is a hand-set clock (:class:`tests.support.clock.Clock`) wherever a rule reads it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kproxy.admin.book import AdminError, RuleBook
from kproxy.analysis.whatif import WhatIfRules, evaluator
from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.protocol import encode_request, frame
from kproxy.protocol.compression import Codec
from kproxy.protocol.frame_builder import request_body
from kproxy.protocol.headers import RequestHeader
from kproxy.protocol.records import Record, encode_batch_v2
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.commands import CloseConnection, ForwardUpstream, SendToClient, WakeAt
from kproxy.proxy.session import Session
from kproxy.rules import RulesError, load_text
from kproxy.rules.lint import warnings_of_text
from kproxy.subcommands.rules_admin import rules_table
from tests.support.clock import Clock
from tests.test_rules_session import produce_answer

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "rules" / "kproxy-rules.schema.json").read_text()))
PRODUCE = 0


def produce(correlation_id: int, size: int = 0, client_id: str = "producer-1") -> bytes:
    """A Produce v9 request whose one partition carries ``size`` bytes of records."""
    body = request_body(PRODUCE, 9, transactional_id=None, acks=1, timeout_ms=1500,
                        topic_data=[{"name": "orders", "partition_data": [{"index": 0,
                                                                           "records": b"\0" * size or None}]}])
    return frame(encode_request(RequestHeader(PRODUCE, 9, correlation_id, client_id, 2), body))


class Connection:
    """One client connection through a real Session; :meth:`send` says what became of a Produce:
    ``answered`` (by a rule), ``forwarded`` (its answer came at once) or ``held``."""

    def __init__(self, live: LiveRules, clock: Clock, peer: str = "127.0.0.1:5555", *, principal: str | None = None,
                 client_id: str = "producer-1") -> None:
        self.clock = clock
        policy = live.policy(peer)
        assert policy is not None
        policy.principal = principal  # what a login or a client certificate would have set
        self.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=clock, policy=policy)
        self.client_id = client_id
        self.next_id = 0

    def send(self, size: int = 0) -> str:
        self.next_id += 1
        commands = self.session.receive_client(produce(self.next_id, size, self.client_id), self.clock.now)
        if not any(isinstance(c, ForwardUpstream) for c in commands):
            assert any(isinstance(c, SendToClient) for c in commands)
            return "answered"
        after = self.session.receive_upstream(produce_answer(self.next_id))
        return "forwarded" if any(isinstance(c, SendToClient) for c in after) else "held"


def live_rules(text: str) -> tuple[LiveRules, Clock]:
    clock = Clock()
    return LiveRules(load_text(text), counts=FaultStats(), clock=clock, wall_clock=clock), clock


def problems(text: str) -> list[str]:
    with pytest.raises(RulesError) as bad:
        load_text(text, "r.yaml")
    return [str(p) for p in bad.value.problems]


def valid_for_editors(text: str) -> bool:
    return not list(VALIDATOR.iter_errors(yaml.safe_load(text)))


def what_if(text: str, records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The what-if's hits (kproxy.analysis.whatif's evaluator, as Spark runs it on one partition)."""
    return list(evaluator(WhatIfRules("r.yaml", text), 0)(iter(records)))


def record(correlation_id: int, *, request_bytes: int = 100, connection: str = "c1", at_s: float = 0.0,
           client_id: str = "producer-1", principal: str | None = None) -> dict[str, Any]:
    """A captured Produce record, as the what-if reads it."""
    return {"connection_id": connection, "correlation_id": correlation_id, "api_key": PRODUCE,
            "api_name": "produce", "api_version": 9, "client_id": client_id, "principal": principal,
            "client_host": "127.0.0.1", "node_id": None, "acks": 1, "group_id": None, "transactional_id": None,
            "request_bytes": request_bytes, "request_us": int(at_s * 1e6),
            "topics": [{"topic": "orders", "partition": 0}]}


# -- request_bytes ---------------------------------------------------------------------------------
BIG_PRODUCE = """
rules:
  - id: big-produce
    match: {api: produce, request_bytes: {min: 1048576}}
    actions: [{inject_error: {error: MESSAGE_TOO_LARGE}}]
"""


def test_request_bytes_matches_requests_within_its_bounds() -> None:
    live, clock = live_rules(BIG_PRODUCE)
    conn = Connection(live, clock)
    assert conn.send(1000) == "forwarded"
    assert conn.send(1 << 20) == "answered"
    assert conn.send(2 << 20) == "answered"
    assert conn.send(10) == "forwarded"
    live.replace(load_text("""
rules:
  - id: mid
    match: {api: produce, request_bytes: {min: 500, max: 2000}}
    actions: [{inject_error: {error: MESSAGE_TOO_LARGE}}]
"""), origin="test")
    assert [conn.send(n) for n in (100, 600, 1900, 3000)] == ["forwarded", "answered", "answered", "forwarded"]


def test_request_bytes_is_checked_by_the_loader_and_the_editors_schema() -> None:
    assert valid_for_editors(BIG_PRODUCE)
    rule = load_text(BIG_PRODUCE).rules[0]
    assert (rule.match.min_request_bytes, rule.match.max_request_bytes) == (1048576, None)
    bad = "rules: [{id: r, match: {request_bytes: %s}, actions: [drop_response]}]"
    assert problems(bad % "{min: 10, max: 5}") == ["r.yaml:1: rules[0].match.request_bytes: request_bytes: min is "
                                                   "above max"]
    assert problems(bad % "1000") == ["r.yaml:1: rules[0].match.request_bytes: expected {min: BYTES, max: BYTES} "
                                      "(either or both)"]
    assert problems(bad % "{}") == ["r.yaml:1: rules[0].match.request_bytes: give min, max or both"]
    assert problems(bad % "{mni: 3}") == ["r.yaml:1: rules[0].match.request_bytes.mni: unknown key "
                                          "(did you mean 'min'?)"]
    assert problems(bad % "{min: -1}") == ["r.yaml:1: rules[0].match.request_bytes.min: must be >= 0, got -1"]
    assert not valid_for_editors(bad % "{min: 10, mni: 3}")


def test_the_what_if_matches_request_bytes_against_the_captured_size() -> None:
    hits = what_if(BIG_PRODUCE, [record(1, request_bytes=2 << 20), record(2, request_bytes=300)])
    assert [(h[2], h[7]) for h in hits] == [(1, "big-produce")]


# -- schedule per connection -----------------------------------------------------------------------
FIRST_OF_EACH_CONNECTION = """
rules:
  - id: first-produce
    match: {api: produce, schedule: {first: 1, per: connection}}
    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
"""


def test_per_connection_counters_take_the_first_request_of_every_new_connection() -> None:
    live, clock = live_rules(FIRST_OF_EACH_CONNECTION)
    one, two = Connection(live, clock), Connection(live, clock, "127.0.0.1:5556")
    assert [one.send() for _ in range(3)] == ["answered", "forwarded", "forwarded"]
    assert [two.send() for _ in range(2)] == ["answered", "forwarded"]
    assert Connection(live, clock).send() == "answered", "a reconnect is a new connection"
    assert one.send() == "forwarded"


def test_per_connection_counts_every_and_after_requests_apart_per_connection() -> None:
    live, clock = live_rules("""
rules:
  - id: every-other-after-one
    match: {api: produce, schedule: {after_requests: 1, every: 2, per: connection}}
    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
""")
    one, two = Connection(live, clock), Connection(live, clock)
    assert [one.send() for _ in range(3)] + [two.send() for _ in range(3)] == \
        ["forwarded", "answered", "forwarded"] * 2


def test_per_is_checked_by_the_loader_and_the_editors_schema() -> None:
    assert valid_for_editors(FIRST_OF_EACH_CONNECTION)
    bad = "rules: [{id: r, match: {schedule: %s}, actions: [drop_response]}]"
    assert problems(bad % "{first: 1, per: client}") == [
        "r.yaml:1: rules[0].match.schedule.per: per is connection or rule, got 'client'"]
    assert problems(bad % "{for_seconds: 5, per: connection}") == [
        "r.yaml:1: rules[0].match.schedule.per: per: connection scopes the request counters: give first, every or "
        "after_requests"]
    assert not valid_for_editors(bad % "{first: 1, per: client}")
    assert load_text(bad % "{first: 1, per: rule}").rules[0].match.schedule == load_text(bad % "{first: 1}").rules[
        0].match.schedule


def test_the_what_if_counts_per_connection_in_each_captured_connection() -> None:
    records = [record(1, connection="a"), record(2, connection="a", at_s=1), record(1, connection="b", at_s=2),
               record(3, connection="a", at_s=3), record(2, connection="b", at_s=4)]
    hits = what_if(FIRST_OF_EACH_CONNECTION, records)
    assert [(h[0], h[2]) for h in hits] == [("a", 1), ("b", 1)]


# -- a ramping delay -------------------------------------------------------------------------------
RAMP = """
rules:
  - id: ramp
    match: {api: produce, schedule: {after_seconds: 10}}
    actions: [{delay: {ms: {from: 10, to: 500, over_seconds: 300}}}]
"""


def held_ms(conn: Connection) -> float:
    """How long a Produce's answer is held: sent at the clock's now, released at the session's wake."""
    conn.next_id += 1
    sent = conn.clock.now
    conn.session.receive_client(produce(conn.next_id), sent)
    after = conn.session.receive_upstream(produce_answer(conn.next_id))
    assert not any(isinstance(c, SendToClient) for c in after)
    wake = next(c.when for c in after if isinstance(c, WakeAt))
    conn.clock.now = wake
    assert any(isinstance(c, SendToClient) for c in conn.session.on_timer(wake))
    return round((wake - sent) * 1000, 3)


def test_a_ramping_delay_grows_from_its_start_to_its_end_and_stays() -> None:
    live, clock = live_rules(RAMP)
    conn = Connection(live, clock)
    clock.now += 5
    assert conn.send() == "forwarded", "before after_seconds"
    seen = []
    for at in (10, 160, 310, 1000):
        clock.now = 100.0 + at  # the rule set was loaded at 100.0
        seen.append(held_ms(conn))
    assert seen == [10.0, 255.0, 500.0, 500.0]


def test_the_what_if_resolves_a_ramp_at_each_records_time() -> None:
    hits = what_if(RAMP, [record(1, at_s=5), record(2, at_s=10), record(3, at_s=160), record(4, at_s=400)])
    assert [(h[2], h[12]) for h in hits] == [(2, 10.0), (3, 255.0), (4, 500.0)]


# -- periodic flapping -----------------------------------------------------------------------------
FLAPPING = """
rules:
  - id: flapping
    match: {api: produce, schedule: {after_seconds: 10, for_seconds: 30, period_seconds: 300}}
    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
"""


def test_a_flapping_rule_acts_for_its_window_in_every_period() -> None:
    live, clock = live_rules(FLAPPING)
    conn = Connection(live, clock)
    seen = {}
    for at in (5, 10, 39.9, 40, 309.9, 310, 339.9, 340, 910, 939):
        clock.now = 100.0 + at
        seen[at] = conn.send()
    assert [at for at, what in seen.items() if what == "answered"] == [10, 39.9, 310, 339.9, 910, 939]


def test_period_seconds_is_checked_by_the_loader_and_the_editors_schema() -> None:
    assert valid_for_editors(FLAPPING)
    schedule = load_text(FLAPPING).rules[0].match.schedule
    assert schedule is not None and (schedule.for_s, schedule.period_s) == (30.0, 300.0)
    bad = "rules: [{id: r, match: {schedule: %s}, actions: [drop_response]}]"
    assert problems(bad % "{period_seconds: 300}") == [
        "r.yaml:1: rules[0].match.schedule: period_seconds repeats the for_seconds window: give for_seconds"]
    assert problems(bad % "{for_seconds: 30, period_seconds: 30}") == [
        "r.yaml:1: rules[0].match.schedule: period_seconds must be above for_seconds (else the window never closes)"]
    assert problems(bad % "{for_seconds: 30, period_seconds: -1}") == [
        "r.yaml:1: rules[0].match.schedule.period_seconds: must be > 0, got -1"]
    assert not valid_for_editors(bad % "{for_seconds: 30, period_seconds: -1}")


def test_the_what_if_flaps_as_the_proxy_does() -> None:
    hits = what_if(FLAPPING, [record(i, at_s=at) for i, at in enumerate((5, 10, 39.9, 40, 310, 340))])
    assert [h[2] for h in hits] == [1, 2, 4]


# -- throttle per principal ------------------------------------------------------------------------
USER_QUOTA = """
rules:
  - id: user-quota
    match: {api: produce}
    actions: [{throttle: {requests_per_second: 1, burst_seconds: 1, scope: principal}}]
"""


def test_a_principal_scoped_throttle_shares_one_bucket_over_a_users_connections_and_client_ids() -> None:
    live, clock = live_rules(USER_QUOTA)
    alice_1 = Connection(live, clock, principal="User:alice", client_id="alice-app")
    alice_2 = Connection(live, clock, "127.0.0.1:5556", principal="User:alice", client_id="alice-batch")
    bob = Connection(live, clock, "127.0.0.1:5557", principal="User:bob", client_id="alice-app")
    assert alice_1.send() == "forwarded"  # alice's one token
    assert alice_2.send() == "held", "another connection and client id of alice: her bucket"
    assert bob.send() == "forwarded", "bob's own bucket, whatever his client id"
    anonymous = [Connection(live, clock, f"127.0.0.1:{port}") for port in (5558, 5559)]
    assert [c.send() for c in anonymous] == ["forwarded", "held"], "unknown principals share one bucket"


def test_the_what_if_charges_a_principal_scoped_throttle_per_captured_principal() -> None:
    records = [record(1, principal="User:alice", client_id="a"), record(2, principal="User:alice", client_id="b"),
               record(3, principal="User:bob", client_id="a")]
    hits = what_if(USER_QUOTA, records)
    assert [(h[2], h[13]) for h in hits] == [(1, 0.0), (2, 1000.0), (3, 0.0)]


# -- shown live ------------------------------------------------------------------------------------
def test_the_admin_listing_and_rules_list_show_each_scenario_keys_state_now() -> None:
    live, clock = live_rules(RAMP + FLAPPING.replace("rules:\n", "") + FIRST_OF_EACH_CONNECTION.replace("rules:\n", "")
                             + BIG_PRODUCE.replace("rules:\n", "") + USER_QUOTA.replace("rules:\n", "") + """
  - id: counted
    match: {api: metadata, schedule: {first: 3}}
    actions: [drop_response]
""")
    book = RuleBook(live)
    clock.now += 160  # the ramp is half-way; the flapping window opened at 10 s and closed at 40 s
    conn = Connection(live, clock)
    conn.send()
    state = {r["id"]: r.get("state") for r in book.listing()["rules"]}
    assert state == {
        "ramp": {"window_open": True, "window_changes_in_seconds": None, "ramp_ms": [255.0]},
        "flapping": {"window_open": False, "window_changes_in_seconds": 150.0},
        "first-produce": {"per": "connection"},
        "big-produce": {"request_bytes": {"min": 1048576}},
        "user-quota": {"throttle_scope": "principal"},
        "counted": {"counted": 0},
    }
    table = rules_table(book.listing()).splitlines()
    assert table[1].split()[-1] == "STATE"
    rows = {line.split()[0]: line for line in table[2:]}
    assert re.search(r" delay +window=open ramp=255ms$", rows["ramp"]), rows["ramp"]
    assert rows["flapping"].endswith("window=closed for 2m30s")
    assert rows["first-produce"].endswith("per=connection")
    assert rows["big-produce"].endswith("request_bytes>=1048576")
    assert rows["counted"].endswith("counted=0")


# -- sequences across rules ------------------------------------------------------------------------
SEQUENCE = """
rules:
  - id: errors-first
    match: {api: produce, schedule: {first: 2}}
    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
  - id: after-three-slow
    match: {api: produce, schedule: {after: {rule: then-slow, fired: 3}}}
    actions: [close_connection]
  - id: then-slow
    match: {api: produce, schedule: {after: {rule: errors-first, ended: true}, for_seconds: 10}}
    actions: [{delay: {ms: 50}}]
"""


def test_a_rule_starts_when_another_ended_and_one_when_another_fired_n_times() -> None:
    live, clock = live_rules(SEQUENCE)
    conn = Connection(live, clock)
    assert [conn.send() for _ in range(2)] == ["answered"] * 2  # errors-first, then it has ended
    clock.now += 100  # then-slow's window counts from its release, not from the load
    assert [conn.send() for _ in range(3)] == ["held"] * 3
    conn.session.on_timer(clock.now + 1)
    clock.now += 1
    commands = conn.session.receive_client(produce(99), clock.now)
    assert any(isinstance(c, CloseConnection) for c in commands), "after then-slow fired 3 times"


def test_a_rule_waiting_on_a_time_window_starts_when_it_closes() -> None:
    live, clock = live_rules("""
rules:
  - id: hole
    match: {api: produce, schedule: {for_seconds: 5}}
    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
  - id: next
    match: {api: produce, schedule: {after: {rule: hole, ended: true}, for_seconds: 5}}
    actions: [{inject_error: {error: NOT_ENOUGH_REPLICAS}}]
""")
    conn = Connection(live, clock)
    assert conn.send() == "answered"  # hole
    clock.now += 6
    assert conn.send() == "answered"  # next, released now: 5 s from here
    clock.now += 4
    assert conn.send() == "answered"
    clock.now += 2
    assert conn.send() == "forwarded"


def test_sequences_are_checked_by_the_loader_the_admin_api_and_the_editors_schema() -> None:
    assert valid_for_editors(SEQUENCE)
    base = ("rules:\n  - {id: a, match: {schedule: %s}, actions: [drop_response]}\n"
            "  - {id: b, match: {}, actions: [drop_response]}")
    assert problems(base % "{after: {rule: c, fired: 1}}") == [
        "r.yaml:2: rules[0].match.schedule.after: names no rule 'c'"]
    assert problems(base % "{after: {rule: a, fired: 1}}") == [
        "r.yaml:2: rules[0].match.schedule.after: a rule cannot wait on itself"]
    assert problems(base % "{after: {rule: b, ended: true}}") == [
        "r.yaml:2: rules[0].match.schedule.after: rule 'b' never ends: give it for_seconds (without "
        "period_seconds) or first (per rule), or wait on fired: N"]
    assert problems(base % "{after: {rule: b}}") == [
        "r.yaml:2: rules[0].match.schedule.after: give one of fired: N or ended: true"]
    assert problems(base % "{after: {rule: b, ended: false}}") == [
        "r.yaml:2: rules[0].match.schedule.after.ended: ended is true, or leave it out"]
    cycle = "rules:\n  - {id: a, match: {schedule: {after: {rule: b, fired: 1}}}, actions: [drop_response]}\n" \
            "  - {id: b, match: {schedule: {after: {rule: a, fired: 1}}}, actions: [drop_response]}"
    assert problems(cycle) == ["r.yaml:2: rules[0].match.schedule.after: rules wait on each other in a cycle "
                               "(a -> b -> a)",
                               "r.yaml:3: rules[1].match.schedule.after: rules wait on each other in a cycle "
                               "(b -> a -> b)"]
    assert not valid_for_editors(base % "{after: {rule: b}}")
    live, _ = live_rules(SEQUENCE)
    book = RuleBook(live)
    state = {r["id"]: r.get("state") for r in book.listing()["rules"]}
    assert state == {"errors-first": {"counted": 0}, "after-three-slow": {"waits_on": "then-slow", "released": False},
                     "then-slow": {"waits_on": "errors-first", "released": False}}
    with pytest.raises(AdminError) as refused:
        book.delete("then-slow")
    assert refused.value.status == 409 and refused.value.errors == [
        {"path": "after-three-slow: match.schedule.after", "reason": "names no rule 'then-slow'"}]
    book.add({"id": "late", "match": {"schedule": {"after": {"rule": "errors-first", "fired": 1}}},
              "actions": ["drop_response"]})  # one rule added through the API may wait on the file's


def test_the_what_if_runs_a_sequence_in_capture_order() -> None:
    hits = what_if(SEQUENCE, [record(i, at_s=i) for i in range(1, 8)])
    assert [(h[2], h[7]) for h in hits] == [(1, "errors-first"), (2, "errors-first"), (3, "then-slow"),
                                            (4, "then-slow"), (5, "then-slow"), (6, "after-three-slow"),
                                            (7, "after-three-slow")]


# -- record content --------------------------------------------------------------------------------
RECORD_KEY = """
rules:
  - id: user-42
    match: {api: produce, record: {key: "user-42", header: tenant, header_value: "acme|initech"}}
    actions: [{inject_error: {error: INVALID_RECORD}}]
"""


def produce_records(correlation_id: int, *records: Record, codec: int = Codec.NONE) -> bytes:
    body = request_body(PRODUCE, 9, transactional_id=None, acks=1, timeout_ms=1500, topic_data=[
        {"name": "orders", "partition_data": [{"index": 0, "records": encode_batch_v2(records, codec=codec)}]}])
    return frame(encode_request(RequestHeader(PRODUCE, 9, correlation_id, "producer-1", 2), body))


def sent(conn: Connection, request: bytes) -> str:
    conn.next_id += 1
    commands = conn.session.receive_client(request, conn.clock.now)
    return "forwarded" if any(isinstance(c, ForwardUpstream) for c in commands) else "answered"


def rec(key: bytes | None, headers: list[tuple[str, bytes | None]] | None = None, offset: int = 0) -> Record:
    return Record(offset, 1000, key, b"v", headers or [])


def test_a_record_key_matches_when_one_record_has_the_key_and_the_header() -> None:
    live, clock = live_rules(RECORD_KEY)
    conn = Connection(live, clock)
    acme = [("tenant", b"acme")]
    assert sent(conn, produce_records(1, rec(b"user-41", acme), rec(b"user-42", acme, 1))) == "answered"
    assert sent(conn, produce_records(2, rec(b"user-42", [("tenant", b"globex")]))) == "forwarded"
    assert sent(conn, produce_records(3, rec(b"user-42"), rec(b"user-7", acme, 1))) == "forwarded", \
        "the key and the header must be on the same record"
    assert sent(conn, produce_records(4, rec(None, acme))) == "forwarded"
    assert sent(conn, produce_records(5, rec(b"user-42", [("tenant", b"initech")]), codec=Codec.GZIP)) == "answered"


def test_a_request_whose_records_exceed_the_budget_does_not_match() -> None:
    live, clock = live_rules(RECORD_KEY)
    conn = Connection(live, clock)
    # 5,000 records of 64 bytes' cost each: past the 256 KiB budget.
    many = [rec(b"x", [("tenant", b"acme")], i) for i in range(5_000)] + [rec(b"user-42", [("tenant", b"acme")],
                                                                            5_000)]
    assert sent(conn, produce_records(1, *many, codec=Codec.GZIP)) == "forwarded"
    assert sent(conn, produce_records(2, *many[-100:], codec=Codec.GZIP)) == "answered"


def test_record_is_checked_by_the_loader_and_the_editors_schema() -> None:
    assert valid_for_editors(RECORD_KEY)
    bad = "rules: [{id: r, match: {%s}, actions: [drop_response]}]"
    assert problems(bad % "api: fetch, record: {key: a}") == [
        "r.yaml:1: rules[0].match.record: record matches the records of Produce requests: give api: produce"]
    assert problems(bad % "api: produce, record: {}") == ["r.yaml:1: rules[0].match.record: give key, header or both"]
    assert problems(bad % "api: produce, record: {header_value: a}") == [
        "r.yaml:1: rules[0].match.record: header_value needs header (the header's name)"]
    assert problems(bad % "api: produce, record: {key: \"(a\"}")[0].startswith(
        "r.yaml:1: rules[0].match.record.key: bad regex")
    assert not valid_for_editors(bad % "api: produce, record: {kye: a}")


def test_the_what_if_matches_record_keys_from_captured_payloads() -> None:
    keyed = "\n".join(RECORD_KEY.splitlines()).replace(', header: tenant, header_value: "acme|initech"', "")
    payload = {"topic": "orders", "partition": 0, "offset": 0, "key": b"user-42", "value": b"v", "key_size": 7,
               "value_size": 1}
    cut = {**payload, "key": b"user-4", "key_size": 7}  # the capture's cap cut it: unknown
    hits = what_if(keyed, [{**record(1), "payloads": [payload]}, {**record(2), "payloads": [cut]},
                           {**record(3), "payloads": None}])
    assert [h[2] for h in hits] == [1]
    assert what_if(RECORD_KEY, [{**record(1), "payloads": [payload]}]) == [], "a capture keeps no headers"


# -- rules check: what the new keys mean for shadowing ------------------------------------------------
@pytest.mark.parametrize(("first", "second", "shadowed"), [
    ("request_bytes: {min: 1000}", "", False),
    ("request_bytes: {min: 1000}", "request_bytes: {min: 5000, max: 9000}", True),
    ("request_bytes: {max: 1000}", "request_bytes: {min: 10, max: 2000}", False),
    ("record: {key: a}", "", False),
    ("record: {key: a}", "record: {key: a}", True),
    ("toxicity: 0.5", "", False),
])
def test_rules_check_does_not_call_a_rule_shadowed_by_one_that_selects_by_size_record_or_toxicity(
        first: str, second: str, shadowed: bool) -> None:
    text = f"""
rules:
  - {{id: a, match: {{api: produce, {first}}}, actions: [drop_response]}}
  - {{id: b, match: {{api: produce, {second}}}, actions: [drop_response]}}
"""
    assert bool(warnings_of_text(text, "r.yaml")) is shadowed
