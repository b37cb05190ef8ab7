"""Rules executed by a real Session through the server's adapter (kproxy/policy/policy.py), sans-IO.

Every test drives a real :class:`~kproxy.proxy.session.Session` with real frames and a rule file
loaded by :func:`kproxy.rules.load_text`; only the clock is the test's.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.logfmt import parse_logfmt
from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.injector import FaultInjector
from kproxy.policy.live_rules import LiveRules
from kproxy.protocol import decode_response, encode_request, frame
from kproxy.protocol.frame_builder import request_body, request_frame, response_frame
from kproxy.protocol.framing import FrameSplitter
from kproxy.protocol.headers import RequestHeader
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.commands import CloseConnection, Command, ForwardUpstream, SendToClient, WakeAt
from kproxy.proxy.session import Session
from kproxy.rules import load_text
from tests.support.clock import Clock

PRODUCE, METADATA, HEARTBEAT = 0, 3, 12
NOT_LEADER_OR_FOLLOWER, REBALANCE_IN_PROGRESS = 6, 27


class Driver:
    """A Session with a rule set, keeping what its commands asked for."""

    def __init__(self, rules: str, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.live = LiveRules(load_text(rules), counts=FaultStats(), clock=self.clock)
        self.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=self.clock,
                               policy=self.live.policy("127.0.0.1:5555"))
        self.to_client: list[bytes] = []
        self.upstream: list[bytes] = []
        self.closed: CloseConnection | None = None
        self.wake: float | None = None

    def run(self, commands: list[Command]) -> None:
        for c in commands:
            if isinstance(c, SendToClient):
                self.to_client += FrameSplitter().split(c.payload())[0]
            elif isinstance(c, ForwardUpstream):
                self.upstream += FrameSplitter().split(c.payload())[0]
            elif isinstance(c, WakeAt):
                self.wake = c.when
            else:
                assert isinstance(c, CloseConnection)
                self.closed = c

    @property
    def injector(self) -> FaultInjector:
        assert self.live.injector is not None
        return self.live.injector

    def client(self, *frames: bytes) -> None:
        self.run(self.session.receive_client(b"".join(frames), self.clock.now))

    def broker(self, *frames: bytes) -> None:
        self.run(self.session.receive_upstream(b"".join(frames)))

    def tick(self, seconds: float) -> None:
        self.clock.now += seconds
        self.run(self.session.on_timer(self.clock.now))

    def answered(self) -> list[int]:
        return [struct.unpack_from(">i", f, 4)[0] for f in self.to_client]


def produce(correlation_id: int, acks: int, topic: str = "orders", partitions: tuple[int, ...] = (0,)) -> bytes:
    body = request_body(PRODUCE, 9, transactional_id=None, acks=acks, timeout_ms=1500,
                        topic_data=[{"name": topic, "partition_data": [{"index": p, "records": None}
                                                                       for p in partitions]}])
    return frame(encode_request(RequestHeader(PRODUCE, 9, correlation_id, "producer-1", 2), body))


def produce_answer(correlation_id: int, topic: str = "orders", partitions: tuple[int, ...] = (0,)) -> bytes:
    return response_frame(PRODUCE, 9, correlation_id, responses=[
        {"name": topic, "partition_responses": [{"index": p, "error_code": 0, "base_offset": 7} for p in partitions]}])


def heartbeat(correlation_id: int) -> bytes:
    return request_frame(HEARTBEAT, 4, correlation_id, group_id="g", generation_id=1, member_id="m")


def heartbeat_answer(correlation_id: int) -> bytes:
    return response_frame(HEARTBEAT, 4, correlation_id, error_code=0)


def body(api_key: int, version: int, response: bytes) -> dict[str, Any]:
    return decode_response(response[4:], api_key, version).body


def codes(response: bytes) -> list[int]:
    return [p["error_code"] for t in body(PRODUCE, 9, response)["responses"] for p in t["partition_responses"]]


RULES = """
seed: 7
rules:
  - id: {id}
    match: {match}
    actions:
      - {action}
"""


def rules(action: str, match: str = "{api: heartbeat}", rule_id: str = "r1") -> str:
    return RULES.format(id=rule_id, match=match, action=action)


# -- shared with the kinds' own tests (tests/test_rules_action_<kind>.py) --------------------------


class Completed:
    """A SessionObserver keeping the exchanges completed."""

    def __init__(self) -> None:
        self.done: list[Any] = []

    def request(self, exchange: Any) -> None:
        pass

    def complete(self, exchange: Any) -> None:
        self.done.append(exchange)


def upstream_ids(d: Driver) -> list[int]:
    return [struct.unpack_from(">i", f, 8)[0] for f in d.upstream]


HOLE_FOR_2S = "{api: produce, schedule: {for_seconds: 2}}"


# -- dry runs and fault lines ---------------------------------------------------------------------


def test_dry_run_changes_nothing_and_logs_the_fault(caplog: pytest.LogCaptureFixture) -> None:
    text = rules("inject_error: {error: REBALANCE_IN_PROGRESS}").replace("    match:", "    dry_run: true\n    match:")
    d = Driver(text)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        d.client(heartbeat(1))
    d.broker(heartbeat_answer(1))
    assert body(HEARTBEAT, 4, d.to_client[0])["error_code"] == 0
    line = parse_logfmt(caplog.records[0].getMessage())
    assert line["event"] == "fault" and line["rule"] == "r1" and line["dry_run"] == "true"
    assert d.injector.counts.hits == {("r1", "inject_error", "true"): 1}


def test_fault_log_line_names_rule_connection_request_and_topic(caplog: pytest.LogCaptureFixture) -> None:
    d = Driver(rules("inject_error: {error: NOT_LEADER_OR_FOLLOWER}", "{api: produce, topic: 'ord*'}"))
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        d.client(produce(41, -1, partitions=(2, 0)))
    line = parse_logfmt(caplog.records[0].getMessage())
    assert line == {"event": "fault", "rule": "r1", "action": "inject_error", "connection": "127.0.0.1:5555",
                    "correlation_id": "41", "api": "produce", "topic": "orders", "partition": "0,2",
                    "detail": "inject_error NOT_LEADER_OR_FOLLOWER respond"}
    assert d.injector.counts.injected_errors == {("produce", "NOT_LEADER_OR_FOLLOWER"): 1}


# -- rules replaced while the connection is open (kproxy/policy/live_rules.py) -----------------------
def test_replaced_rules_apply_from_the_next_request_and_a_decided_request_keeps_its_rules() -> None:
    d = Driver(rules("inject_error: {error: NOT_LEADER_OR_FOLLOWER, mode: replace}", "{api: produce}"))
    d.client(produce(1, -1))  # decided under generation 1: its answer is to be rewritten
    assert d.live.generation == 1
    assert d.live.replace(load_text(rules("inject_error: {error: REBALANCE_IN_PROGRESS}")), origin="test") == 2
    d.client(produce(2, -1), heartbeat(3))  # generation 2: produce untouched, heartbeat answered locally
    d.broker(produce_answer(1), produce_answer(2))
    assert d.answered() == [1, 2, 3]
    assert codes(d.to_client[0]) == [NOT_LEADER_OR_FOLLOWER]
    assert codes(d.to_client[1]) == [0]
    assert body(HEARTBEAT, 4, d.to_client[2])["error_code"] == REBALANCE_IN_PROGRESS
    assert d.live.counts.injected_errors == {("produce", "NOT_LEADER_OR_FOLLOWER"): 1,
                                             ("heartbeat", "REBALANCE_IN_PROGRESS"): 1}


def test_rules_removed_mid_connection_stop_at_once_and_a_mutable_set_gives_every_connection_a_policy() -> None:
    d = Driver(rules("inject_error: {error: REBALANCE_IN_PROGRESS}"))
    d.live.replace(None, origin="test")
    assert d.live.counts.rules_loaded == 0
    d.client(heartbeat(1))
    assert len(d.upstream) == 1  # forwarded: no rules in force
    off = LiveRules(None, counts=FaultStats())
    assert off.policy("127.0.0.1:1") is None  # rules off for good: sessions get no policy at all
    off.mutable = True
    assert off.policy("127.0.0.1:1") is not None


# -- the guarantees under random rules and streams -------------------------------------------------
ACTIONS = ["inject_error: {error: NOT_LEADER_OR_FOLLOWER}", "inject_error: {error: 6, mode: replace}",
           "delay: {ms: 30, jitter_ms: 20}", "delay: {ms: 10, at: response}", "drop_response",
           "throttle: {requests_per_second: 50}", "duplicate_records"]


def _acts_on(spec: tuple[str, str, float]) -> bool:
    return spec[0] == "produce" or "records" not in spec[1]  # record actions are Produce and Fetch only


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["produce", "heartbeat"]), st.sampled_from(ACTIONS),
                          st.sampled_from([0.3, 0.7, 1.0])).filter(_acts_on),
                min_size=1, max_size=4),
       st.lists(st.sampled_from(["p1", "p0", "hb"]), min_size=1, max_size=30), st.integers(0, 3))
def test_random_rules_keep_order_ids_and_acks0_silence(rule_specs: list[tuple[str, str, float]],
                                                       stream: list[str], seed: int) -> None:
    text = f"seed: {seed}\nrules:\n" + "".join(
        f"  - id: r{i}\n    continue: true\n    match: {{api: {api}, probability: {p}}}\n    actions:\n      - {a}\n"
        for i, (api, a, p) in enumerate(rule_specs)) if rule_specs else "seed: 0\nrules: []\n"
    d = Driver(text)
    expected: list[int] = []
    for i, kind in enumerate(stream, 1):
        d.client(heartbeat(i) if kind == "hb" else produce(i, 0 if kind == "p0" else -1))
        if kind != "p0":
            expected.append(i)
        d.clock.now += 0.01
    for f in list(d.upstream):  # a broker answering every request that reached it, in order
        api, _, cid = struct.unpack_from(">hhi", f, 4)
        d.broker(heartbeat_answer(cid) if api == HEARTBEAT else produce_answer(cid))
    for _ in range(200):
        if d.wake is None:
            break
        d.clock.now, d.wake = max(d.clock.now, d.wake), None
        d.run(d.session.on_timer(d.clock.now))
    got = d.answered()
    assert d.closed is None
    assert got == [c for c in expected if c in set(got)], "responses left out of request order"
    assert len(got) == len(set(got))
    assert not {i for i, k in enumerate(stream, 1) if k == "p0"} & set(got), "an acks=0 Produce got an answer"
    assert d.session.in_flight_count == 0


# -- metrics ---------------------------------------------------------------------------------------
def test_faults_are_exported_as_prometheus_metrics() -> None:
    from prometheus_client import generate_latest

    from kproxy.metrics.exposition import LiveGauges, make_registry
    from kproxy.metrics.stats import TrafficStats

    stats = TrafficStats()
    text = """
rules:
  - id: deny
    match: {api: heartbeat}
    actions: [{inject_error: {error: REBALANCE_IN_PROGRESS}}]
  - id: quota
    match: {api: produce}
    actions: [{throttle: {requests_per_second: 1, burst_seconds: 1}}, drop_response]
  - id: idle
    match: {api: fetch}
    actions: [close_connection]
"""
    d = Driver(text)
    d.live = LiveRules(load_text(text), counts=stats.faults, clock=d.clock)
    d.session.policy = d.live.policy("127.0.0.1:5555")
    d.client(heartbeat(1), produce(2, -1), produce(3, -1))
    exported = generate_latest(make_registry(stats, LiveGauges)).decode()
    for line in ['kproxy_rules_loaded 3.0',
                 'kproxy_rule_hits_total{action="inject_error",dry_run="false",rule="deny"} 1.0',
                 'kproxy_rule_hits_total{action="close_connection",dry_run="false",rule="idle"} 0.0',
                 'kproxy_injected_errors_total{api="heartbeat",error="REBALANCE_IN_PROGRESS"} 1.0',
                 'kproxy_rule_throttle_seconds_total{rule="quota"} 1.0',
                 'kproxy_rule_connection_faults_total{action="drop_response",rule="quota"} 2.0']:
        assert line in exported, line


# -- what a verdict costs must not change what it does (kproxy/policy/policy.py's shortcuts) ------
def heartbeat_from(correlation_id: int, client_id: str | None) -> bytes:
    return request_frame(HEARTBEAT, 4, correlation_id, client_id=client_id, group_id="g", generation_id=1,
                         member_id="m")


def test_a_client_changing_its_client_id_meets_the_rules_of_each_id() -> None:
    """The policy remembers, per connection, whether its client id passes the rules of an api key:
    a client that changes its client id mid-connection (nothing forbids it) is judged anew."""
    d = Driver(rules("inject_error: {error: REBALANCE_IN_PROGRESS}", "{api: heartbeat, client_id: 'a.*'}"))
    ids = ["b", "a1", "a1", "b", None, "a2", "\u00e9t\u00e9"]
    d.client(*(heartbeat_from(i, cid) for i, cid in enumerate(ids, 1)))
    upstream = sorted(struct.unpack_from(">i", f, 8)[0] for f in d.upstream)
    assert upstream == [1, 4, 5, 7]  # b, b, null, été: forwarded; a1, a1, a2 answered locally
    assert d.injector.counts.hits == {("r1", "inject_error", "false"): 3}


def test_rules_replaced_are_read_afresh_for_api_keys_the_connection_already_sent() -> None:
    """What each api key needs is remembered per rule set: a replacement must not be judged by the
    previous set's answers (an api key no rule named, a client id no rule admitted)."""
    d = Driver(rules("delay: {ms: 200}", "{api: produce}"))
    d.client(heartbeat_from(1, "app"))
    d.live.replace(load_text(rules("inject_error: {error: REBALANCE_IN_PROGRESS}",
                                   "{api: heartbeat, client_id: other}")), origin="test")
    d.client(heartbeat_from(2, "app"))
    d.live.replace(load_text(rules("inject_error: {error: REBALANCE_IN_PROGRESS}",
                                   "{api: heartbeat, client_id: app}")), origin="test")
    d.client(heartbeat_from(3, "app"))
    assert [struct.unpack_from(">i", f, 8)[0] for f in d.upstream] == [1, 2]
    assert d.live.counts.hits[("r1", "inject_error", "false")] == 1


@pytest.mark.parametrize("inside", [True, False])
def test_a_window_rule_reads_the_wall_clock(inside: bool) -> None:
    """The wall clock is read only when a rule has a daily window; then it must be read."""
    now = time.time() % 86400
    start = (now - 600 if inside else now + 1800) % 86400
    # The end wraps past midnight too (a window with end < start does): near 24:00 it would read 24:xx.
    hhmm = [f"{int(t) // 3600:02d}:{int(t) % 3600 // 60:02d}:{int(t) % 60:02d}"
            for t in (start, (start + 1200) % 86400)]
    d = Driver(rules("inject_error: {error: REBALANCE_IN_PROGRESS}",
                     f"{{api: heartbeat, schedule: {{window: {{start: '{hhmm[0]}', end: '{hhmm[1]}'}}}}}}"))
    d.client(heartbeat(1))
    assert len(d.upstream) == (0 if inside else 1)


@pytest.mark.parametrize(("action", "match", "expected"), [
    ("delay: {ms: 200}", "{api: heartbeat}", [("r1", "delay", "200.0ms at request", False)]),
    ("inject_error: {error: REBALANCE_IN_PROGRESS}", "{api: heartbeat}",
     [("r1", "inject_error", "inject_error REBALANCE_IN_PROGRESS respond", False)]),
    ("drop_response: {}", "{api: heartbeat}", [("r1", "drop_response", "the response will be swallowed", False)]),
])
@pytest.mark.parametrize("report", ["nothing", "ring"])
def test_each_exchange_carries_the_rule_actions_that_acted_on_it(
        action: str, match: str, expected: list[tuple[str, str, str, bool]], report: str) -> None:
    """Exchange.rule_decisions (the capture's rule_decisions column) names every action that acted,
    whether faults are reported or not; a request no rule matched carries none."""
    d = Driver(rules(action, match))
    if report == "ring":
        d.live.recent = deque(maxlen=10)
    seen = d.session.observer = Completed()
    d.client(heartbeat(1), produce(2, -1))
    forwarded = [struct.unpack_from(">i", f, 8)[0] for f in d.upstream]
    d.broker(*([heartbeat_answer(1)] if 1 in forwarded else []), produce_answer(2))
    d.tick(0.3)
    d.session.report()
    by_id = {ex.correlation_id: ex for ex in seen.done}
    assert list(by_id[1].rule_decisions) == expected
    assert by_id[2].rule_decisions == ()


def _errors_per_connection(match: str, connections: int = 200, requests: int = 20) -> list[int]:
    """How many of ``requests`` heartbeats of each of ``connections`` connections (one client) a rule
    answering REBALANCE_IN_PROGRESS under ``match`` met."""
    live = LiveRules(load_text(rules("inject_error: {error: REBALANCE_IN_PROGRESS}", match)), counts=FaultStats(),
                     clock=Clock())
    out = []
    for c in range(connections):
        session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), policy=live.policy(f"127.0.0.1:{c}"))
        met = 0
        for i in range(requests):
            for command in session.receive_client(heartbeat(i)):
                if isinstance(command, SendToClient):
                    met += body(HEARTBEAT, 4, command.payload())["error_code"] == REBALANCE_IN_PROGRESS
            if session.in_flight_count:  # not met: forwarded; answered by the "broker"
                commands = session.receive_upstream(heartbeat_answer(i))
                assert all(body(HEARTBEAT, 4, cmd.payload())["error_code"] == 0
                           for cmd in commands if isinstance(cmd, SendToClient))
        out.append(met)
    return out


def test_toxicity_picks_that_share_of_connections_and_acts_on_every_request_there() -> None:
    met = _errors_per_connection("{api: heartbeat, toxicity: 0.1}")
    assert set(met) == {0, 20}, "a connection drawn in meets the rule on every request; one drawn out on none"
    assert 8 <= met.count(20) <= 36, f"{met.count(20)} of 200 connections drawn in at toxicity 0.1"
    # probability draws per request: at 0.1 over 20 requests most connections meet it at least once.
    per_request = _errors_per_connection("{api: heartbeat, probability: 0.1}")
    assert sum(1 for m in per_request if m) > 140 and 0 < sum(per_request) < 200 * 20
