"""The byte-level toxics' arithmetic (kproxy/toxics.py): what a chunk becomes, and when it leaves."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest

from kproxy.toxics import Direction, Latency, Limit, Pace, Slices, Toxic, WireShaper


@dataclass
class Owner:
    label: str = "rule r: toxic"
    force: bool = True
    bytes: int = 0
    cuts: list[Direction] = field(default_factory=list)

    def in_force(self) -> bool:
        return self.force

    def passed(self, direction: Direction, nbytes: int) -> None:
        self.bytes += nbytes

    def cut(self, direction: Direction) -> None:
        self.cuts.append(direction)


def shaper(*toxics: Toxic, owner: Owner | None = None) -> WireShaper:
    s = WireShaper(Direction.DOWNSTREAM)
    for toxic in toxics:
        s.install(owner or Owner(), toxic, random.Random(7))
    return s


def pieces(s: WireShaper, data: bytes, now: float) -> list[tuple[float, bytes]]:
    return [(due, bytes(part)) for due, part in s.shape(data, now)]


def test_pace_spreads_a_chunk_over_its_transmission_time_and_the_next_waits_for_the_link() -> None:
    s = shaper(Pace(1000))  # 10-byte steps, 10 ms each
    out = pieces(s, b"x" * 35, 5.0)
    assert [len(p) for _, p in out] == [10, 10, 10, 5]
    assert [round(t, 6) for t, _ in out] == [5.0, 5.01, 5.02, 5.03]
    assert b"".join(p for _, p in out) == b"x" * 35
    # Arriving while the link is busy (until 5.035), the next chunk waits for it; after an idle
    # pause it leaves at once: an idle link earns no credit.
    assert pieces(s, b"y", 5.001)[0][0] == pytest.approx(5.035)
    assert pieces(s, b"z", 9.0)[0][0] == 9.0


def test_pace_over_many_chunks_keeps_its_rate() -> None:
    s = shaper(Pace(250_000))
    last = 0.0
    for i in range(1000):  # 4 MB offered at once
        for due, _ in s.shape(b"b" * 4000, i * 1e-6):
            last = due
    assert 4_000_000 / last == pytest.approx(250_000, rel=0.01)


def test_slices_are_the_sizes_asked_and_spaced_by_the_delay() -> None:
    s = shaper(Slices(4, 3, 0.002))
    out = pieces(s, bytes(range(200)), 1.0)
    assert b"".join(p for _, p in out) == bytes(range(200))
    assert {len(p) for _, p in out} <= set(range(1, 8))
    assert len({len(p) for _, p in out}) > 3, "sizes vary"
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(out)]
    assert min(gaps) == pytest.approx(0.002)


def test_latency_delays_every_chunk_and_keeps_their_order() -> None:
    s = shaper(Latency(lambda draw: 0.05 + 0.1 * draw))
    first = pieces(s, b"a", 1.0)
    second = pieces(s, b"b", 1.001)
    assert 1.05 <= first[0][0] <= 1.15
    assert second[0][0] >= first[0][0]
    assert 1.051 <= second[0][0] <= 1.151 or second[0][0] == first[0][0]


def test_limit_lets_exactly_its_bytes_through_then_cuts() -> None:
    owner = Owner()
    s = shaper(Limit(10), owner=owner)
    assert pieces(s, b"0123", 0.0) == [(0.0, b"0123")]
    assert s.cut is None
    assert pieces(s, b"456789abc", 0.0) == [(0.0, b"456789")]
    assert s.cut is owner and owner.cuts == [Direction.DOWNSTREAM]
    assert owner.bytes == 10
    assert pieces(shaper(Limit(0)), b"x", 0.0) == []



def test_limit_cuts_as_soon_as_a_piece_brings_exactly_its_last_byte() -> None:
    """The connection ends with the write of the last byte allowed, not at the next write (which may
    never come: a client waiting for an answer sends nothing more)."""
    owner = Owner()
    s = shaper(Limit(4), owner=owner)
    assert pieces(s, b"0123", 0.0) == [(0.0, b"0123")]
    assert s.cut is owner and owner.cuts == [Direction.DOWNSTREAM]


def test_toxics_chain_in_one_order_whatever_their_install_order() -> None:
    # Slices last: its writes are what leave, even though it was installed first.
    s = shaper(Slices(3), Pace(100), Limit(7))
    out = pieces(s, b"abcdefghij", 0.0)
    assert b"".join(p for _, p in out) == b"abcdefg"
    assert max(len(p) for _, p in out) <= 3
    assert out[-1][0] == pytest.approx(0.06)  # 1-byte pace steps of 10 ms: the 7th leaves at 60 ms


def test_a_toxic_no_longer_in_force_ends_and_the_rest_passes_untouched() -> None:
    owner = Owner()
    s = shaper(Latency(lambda draw: 1.0), owner=owner)
    assert pieces(s, b"a", 0.0) == [(1.0, b"a")]
    owner.force = False
    assert pieces(s, b"b", 0.5) == [(0.5, b"b")]
    assert not s.active


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="size_variation"):
        Slices(4, 4)
    with pytest.raises(ValueError, match="bytes"):
        Limit(-1)
    with pytest.raises(ValueError, match="bytes_per_second"):
        Pace(0)


# -- from a rule to the session: the orders a connection installs ---------------------------------
@pytest.mark.parametrize("logged", [False, True], ids=["fixed-verdict", "per-request-verdict"])
def test_every_hit_brings_the_same_order_and_the_session_hands_them_over(logged: bool) -> None:
    import logging

    from tests.test_rules_session import Driver, heartbeat, rules

    d = Driver(rules("delay: {ms: 30, at: wire, direction: both}"))
    level = logging.INFO if logged else logging.WARNING
    faults = logging.getLogger("kproxy.faults")
    old = faults.level
    faults.setLevel(level)
    try:
        d.client(heartbeat(1))
        d.client(heartbeat(2))
    finally:
        faults.setLevel(old)
    orders = d.session.wire_orders
    assert len(orders) == 2 and orders[0] is orders[1], "one order per (rule, action): the connection installs it once"
    order = orders[0]
    assert order.direction is Direction.BOTH
    assert isinstance(order.toxic, Latency) and order.toxic.delay_s(0.5) == pytest.approx(0.03)
    assert order.owner.in_force()
    assert d.upstream and d.to_client == [], "the frames themselves are not held: the wire is"
    assert d.injector.counts.hits[("r1", "delay", "false")] == 2
    d.live.replace(None, origin="test")
    assert not order.owner.in_force()


def test_the_bytes_through_each_toxic_are_exported_by_rule_action_and_direction() -> None:
    from prometheus_client import generate_latest

    from kproxy.metrics.exposition import LiveGauges, make_registry
    from kproxy.metrics.stats import TrafficStats

    stats = TrafficStats()
    stats.faults.wire_bytes[("slow-link", "bandwidth", "downstream")] = 1234
    text = generate_latest(make_registry(stats, LiveGauges)).decode()
    assert 'kproxy_rule_wire_bytes_total{action="bandwidth",direction="downstream",rule="slow-link"} 1234.0' in text
    list(stats.faults.keep_rules({"another-rule"}))  # the rule is no longer loaded: its series go
    assert stats.faults.wire_bytes == {}
