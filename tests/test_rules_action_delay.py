"""The ``delay`` action (kproxy/rules/actions/delay.py) through its interface: its reader, the delay
the engine works out for each hit (jitter drawn, ramps), and its verdict in a real Session, sans-IO.
At the wire (``at: wire``) it is a byte-level toxic: tests/test_rules_toxics.py, with real clients."""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque

import pytest

from kproxy.logfmt import parse_logfmt
from kproxy.rules import RuleEngine, RulesError, StaticFacts, load_text
from kproxy.rules.actions.base import MAX_DURATION_MS
from kproxy.rules.actions.delay import Delay, Distribution, Ramp
from kproxy.rules.engine import draw
from tests.test_rules_scenarios import RAMP, problems, valid_for_editors
from tests.test_rules_session import Completed, Driver, heartbeat, heartbeat_answer, produce, produce_answer, rules


@pytest.mark.parametrize("at", ["request", "response"])
def test_delay_holds_the_response_and_later_ones_wait_behind_it(at: str) -> None:
    d = Driver(rules(f"delay: {{ms: 200, at: {at}}}"))
    d.client(heartbeat(1), produce(2, -1))
    d.clock.now += 0.05
    d.broker(heartbeat_answer(1), produce_answer(2))
    assert d.to_client == []
    due = 100.2 if at == "request" else 100.25
    assert d.wake == pytest.approx(due)
    d.tick(due - d.clock.now - 0.01)
    assert d.to_client == []
    d.tick(0.02)
    assert d.answered() == [1, 2]


@pytest.mark.parametrize("at", ["request", "response"])
def test_the_time_a_delay_holds_is_the_rules_for_the_held_response_and_those_behind_it(at: str) -> None:
    """``held`` (kproxy_rule_held_seconds, kept out of kproxy_overhead_seconds): from each answer
    to the hold's end, charged to the rule that held the head of the line (the produce behind the
    delayed heartbeat matches no rule)."""
    d = Driver(rules(f"delay: {{ms: 200, at: {at}}}"))
    seen = d.session.observer = Completed()
    d.client(heartbeat(1), produce(2, -1))
    d.clock.now += 0.05
    d.broker(heartbeat_answer(1), produce_answer(2))
    due = 100.2 if at == "request" else 100.25
    d.tick(due + 0.003 - d.clock.now)  # released 3 ms late: the timer's lateness is kproxy's own time
    d.session.report()
    assert d.answered() == [1, 2]
    held = 0.2 if at == "response" else 0.15  # at request: the broker's 50 ms are the broker's
    by_id = {ex.correlation_id: ex for ex in seen.done}
    for ex in by_id.values():
        assert ex.held is not None
        assert ex.held[0] == pytest.approx(held)
        assert ex.held[1] == ("r1", "delay")
        assert ex.overhead_seconds == pytest.approx(0.003)


@pytest.mark.parametrize("match", ["{api: heartbeat}", "{}", "{api: heartbeat, client_id: 'kproxy.*|test.*'}"])
@pytest.mark.parametrize(("action", "detail", "held"), [("delay: {ms: 200}", "200.0ms at request", True),
                                                       ("delay: {ms: 0}", "0.0ms at request", False),
                                                       ("delay: {ms: 200, at: response}", "200.0ms at response", True)])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_delay_rule_does_the_same_whether_its_faults_are_reported_or_not(
        match: str, action: str, detail: str, held: bool, dry_run: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A delay rule that decides every request alike is decided without the request's facts when
    no fault is reported (no ring, no log line): the hold, the wake-up and the hit counters must be
    what the reported path gives, and the reported path must still say what it did."""
    text = rules(action, match)
    if dry_run:
        text = text.replace("    match:", "    dry_run: true\n    match:")
        detail, held = "dry run: nothing done", False
    seen = []
    for report in ("nothing", "ring", "log"):
        d = Driver(text)
        if report == "ring":
            d.live.recent = deque(maxlen=10)
        with caplog.at_level(logging.INFO if report == "log" else logging.WARNING, "kproxy.faults"):
            caplog.clear()
            d.client(heartbeat(1), heartbeat(2))
            lines = [parse_logfmt(r.getMessage()) for r in caplog.records]
        d.clock.now += 0.05  # the broker's time: a response delay counts from its answer, a hold from the request
        d.broker(heartbeat_answer(1), heartbeat_answer(2))
        at_once = d.answered()
        d.tick(0.3)
        seen.append((at_once, d.answered(), d.wake, dict(d.injector.counts.hits)))
        details = [r.detail for r in d.live.recent or ()] if report == "ring" else [line["detail"] for line in lines]
        assert details == ([] if report == "nothing" else [detail, detail]), report
    assert seen[0] == seen[1] == seen[2]
    assert seen[0][3] == {("r1", "delay", "true" if dry_run else "false"): 2}
    assert seen[0][0] == ([] if held else [1, 2]) and seen[0][1] == [1, 2]


def test_normal_jitter_is_centred_and_never_negative() -> None:
    delay = Delay(50, 30, Distribution.NORMAL)
    values = [delay.resolve(draw(1, "n", StaticFacts(api_key=0, stream_ordinal=i), 0)) for i in range(5000)]
    assert min(values) >= 0
    assert 48 < statistics.fmean(v for v in values) < 56  # clamping at 0 lifts the mean slightly
    assert 25 < statistics.stdev(values) < 31


def test_delays_at_their_bound_resolve_finite() -> None:
    for distribution in (Distribution.UNIFORM, Distribution.NORMAL):
        delay = Delay(ms=MAX_DURATION_MS, jitter_ms=MAX_DURATION_MS, distribution=distribution)
        for u in (0.0, 1e-300, 0.5, 1 - 1e-16):
            assert math.isfinite(delay.resolve(u))
    with pytest.raises(ValueError, match="a week"):
        Delay(ms=MAX_DURATION_MS + 1)


def test_a_ramp_is_checked_by_the_loader_and_the_editors_schema() -> None:
    assert valid_for_editors(RAMP)
    action = load_text(RAMP).rules[0].actions[0]
    assert isinstance(action, Delay) and action.ramp == Ramp(10.0, 500.0, 300.0) and action.ms == 10.0
    bad = "rules: [{id: r, match: {}, actions: [{delay: {ms: %s}}]}]"
    assert problems(bad % "{from: 10, to: 500}") == [
        "r.yaml:1: rules[0].actions[0].delay.ms.over_seconds: missing (seconds the ramp takes)"]
    assert problems(bad % "{from: 10, to: 500, over_seconds: 0}") == [
        "r.yaml:1: rules[0].actions[0].delay.ms.over_seconds: must be > 0, got 0"]
    assert problems(bad % "{from: 10, too: 5, over_seconds: 3}") == [
        "r.yaml:1: rules[0].actions[0].delay.ms.too: unknown key (did you mean 'to'?)",
        "r.yaml:1: rules[0].actions[0].delay.ms.to: missing (milliseconds)"]
    assert problems("rules: [{id: r, match: {}, actions: [{delay: {ms: {from: 1, to: 5, over_seconds: 3}, "
                    "at: wire}}]}]") == [
        "r.yaml:1: rules[0].actions[0].delay: a ramp (ms: {from, to, over_seconds}) is for at: request or "
        "response: a wire delay's chunks have no rule time"]
    assert not valid_for_editors(bad % "{from: 10, to: 500}")


def test_the_engine_and_the_listing_ask_a_delay_through_its_hooks() -> None:
    """A ramp's value for the hit, a jitter drawn for it, and the ramp the admin listing shows:
    all asked of the action (RuleAction's hooks), which the engine never names."""
    rule_set = load_text("rules:\n  - id: r\n    match: {api: [produce]}\n    actions:\n"
                         "      - delay: {ms: {from: 0, to: 100, over_seconds: 10}}\n"
                         "      - delay: {ms: 5, jitter_ms: 5}\n")
    ramp, jittered = rule_set.rules[0].actions
    assert ramp.takes_delay and jittered.takes_delay
    assert (ramp.delay_varies, ramp.delay_draws) == (True, False)
    assert (jittered.delay_varies, jittered.delay_draws) == (True, True)
    engine = RuleEngine(rule_set, loaded_at=0.0)
    delays = [engine.evaluate(StaticFacts(api_key=0, client_id="c", stream_ordinal=i, now=5.0)).hits[0].delays_ms
              for i in range(50)]
    assert {ramp_ms for ramp_ms, _ in delays} == {50.0}
    assert all(0 <= ms <= 10 for _, ms in delays) and len({ms for _, ms in delays}) > 1
    shown: dict[str, object] = {}
    ramp.live_state(2.5, shown)
    assert shown == {"ramp_ms": [25.0]} and ramp.has_live_state and not jittered.has_live_state
    assert Delay(ms=5).hit_delay_ms(123.0, 0.99) == 5.0 and not Delay(ms=5).delay_varies


def test_a_direction_is_refused_but_at_the_wire() -> None:
    with pytest.raises(RulesError) as bad:
        load_text(rules("delay: {ms: 5, direction: upstream}"), "d.yaml")
    assert [str(p) for p in bad.value.problems] == [
        "d.yaml:7: rules[0].actions[0].delay: direction is for at: wire only (a request or response delay holds "
        "one frame)"]
