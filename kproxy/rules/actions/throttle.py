"""The ``throttle`` action: token buckets per client id, principal, topic or globally, as quotas.

YAML: ``- throttle: {bytes_per_second: 1e6, requests_per_second: 50, scope:
client_id|principal|topic|global, burst_seconds: 1}``. ``scope: principal`` is Kafka's user
quota: one bucket per authenticated principal (``User:alice``, whatever her client ids and
connections), and one shared by the connections whose principal is unknown (as Kafka's
``User:ANONYMOUS``). A request over its rate is held for the debt
(:class:`kproxy.rules.bucket.TokenBucket`, through
:meth:`kproxy.rules.engine.RuleEngine.throttle_s`), and its answer reports in
``throttle_time_ms`` the throttle time a broker with that quota would give it: its own bytes'
share, not the wait behind requests pipelined ahead of it (kproxy/rules/bucket.py); a Fetch
under a byte rate is charged with its response's size instead
(:func:`kproxy.rules.bucket.charged_on_response`, :func:`charging_response`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.rules.actions.base import MAX_DURATION_S, HitKey, RuleAction
from kproxy.rules.apply import apply_to_response
from kproxy.rules.bucket import charged_on_response, split_throttle
from kproxy.rules.yaml_nodes import Bad, NodeReader

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft
    from kproxy.rules.engine import RuleEngine
    from kproxy.rules.frame_facts import FrameFacts

# Bounds on the rates, so that nothing accepted overflows at run time: a throttle holds a request
# debt / rate seconds and reports that in an int32 throttle_time_ms, and a rate of 5e-324 bytes/s
# made that hold infinite (round(inf) ended the connection).
MIN_BYTES_PER_SECOND = 1.0
MIN_REQUESTS_PER_SECOND = 0.001  # one request every ~17 minutes
MAX_RATE = 1e15  # per second, bytes or requests: far above any link, and rate * burst stays finite


class ThrottleScope(enum.Enum):
    CLIENT_ID = "client_id"
    PRINCIPAL = "principal"
    TOPIC = "topic"
    GLOBAL = "global"


@dataclass(frozen=True, slots=True)
class Throttle(RuleAction):
    """Token buckets (see :class:`kproxy.rules.bucket.TokenBucket`), one per scope key."""

    bytes_per_second: float | None = None
    requests_per_second: float | None = None
    scope: ThrottleScope = ThrottleScope.CLIENT_ID
    burst_s: float = 1.0  # bucket capacity, in seconds of the rate

    kind: ClassVar[str] = "throttle"
    keys: ClassVar[tuple[str, ...]] = ("bytes_per_second", "requests_per_second", "scope", "burst_seconds")
    counts_held: ClassVar[bool] = True
    counts_throttled: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.bytes_per_second is None and self.requests_per_second is None:
            raise ValueError("give bytes_per_second, requests_per_second or both")
        for rate, least, unit in ((self.bytes_per_second, MIN_BYTES_PER_SECOND, "bytes_per_second"),
                                  (self.requests_per_second, MIN_REQUESTS_PER_SECOND, "requests_per_second")):
            if rate is not None and not least <= rate <= MAX_RATE:
                raise ValueError(f"{unit} must be between {least:g} and {MAX_RATE:g}")
        if not 0 < self.burst_s <= MAX_DURATION_S:
            raise ValueError(f"burst_seconds must be > 0 and <= {MAX_DURATION_S} (a week)")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        # Bounded both ways: the hold a throttle imposes is debt / rate (see MIN_BYTES_PER_SECOND).
        for key, least in (("bytes_per_second", MIN_BYTES_PER_SECOND),
                           ("requests_per_second", MIN_REQUESTS_PER_SECOND)):
            if key in m:
                kw[key] = reader.number(m[key], f"{path}.{key}", least, hi=MAX_RATE)
        if "scope" in m:
            kw["scope"] = reader.choice(m["scope"], f"{path}.scope", ThrottleScope)
        if "burst_seconds" in m:
            kw["burst_s"] = reader.number(m["burst_seconds"], f"{path}.burst_seconds", 0.0, exclusive=True,
                                          hi=MAX_DURATION_S)
        return reader.made(at, path, kw, cls)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        engine, facts = draft.engine, draft.facts
        assert engine is not None and facts is not None  # a throttle's verdict is never worked out ahead
        rule_id = key[0]
        if charged_on_response(facts.api_key, self):
            delay, reported, by_bytes = _throttle_on_response(engine, rule_id, self, facts)
            draft.charge_response(rule_id, by_bytes)
        else:
            delay, reported = engine.throttle_s(rule_id, self, facts, draft.request_size)
        if delay > 0:
            draft.hold(delay, key)
            draft.throttle_ms = max(draft.throttle_ms, round(reported * 1000))
            draft.count_throttled(rule_id, delay)
            draft.fault(key, f"held {delay * 1000:.1f}ms, throttle_time_ms {round(reported * 1000)}")


def _throttle_on_response(engine: RuleEngine, rule_id: str, throttle: Throttle, facts: FrameFacts
                          ) -> tuple[float, float, Throttle]:
    """A Fetch under a byte rate: the seconds to hold it (the byte debt left by earlier responses,
    or its request rate's hold), the throttle time to report (the request rate's only: the byte
    debt was reported by the response that made it), and the byte rate alone."""
    by_bytes, by_requests = split_throttle(throttle)
    assert by_bytes is not None
    held, reported = engine.throttle_s(rule_id, by_requests, facts, 1) if by_requests is not None else (0.0, 0.0)
    debt = engine.throttle_delay_s(rule_id, by_bytes, facts, 0)  # nothing charged: what is owed now
    return max(debt, held), reported, by_bytes


def charging_response(engine: RuleEngine, clock: Callable[[], float], facts: FrameFacts,
                      charges: list[tuple[str, Throttle]], edit: Callable[[bytes], bytes] | None
                      ) -> Callable[[bytes], bytes]:
    """The response edit of a Fetch under byte rates (``charges``: a draft's ``response_charges``):
    ``edit`` (if any), then the response's size charged to each byte rate, the throttle time that
    earns reported in its throttle_time_ms (never lowering a larger one already there)."""
    api_key, api_version = facts.api_key, facts.api_version

    def charge(response: bytes) -> bytes:
        if edit is not None:
            response = edit(response)
        facts.now = clock()  # when the broker's answer is seen: the usage happens now
        # The answer leaves as it came (KIP-219): only the throttle time is reported; the next Fetch waits for it.
        throttled = max(engine.throttle_s(rule_id, by_bytes, facts, len(response))[1] for rule_id, by_bytes in charges)
        if throttled > 0:
            response = apply_to_response((), response, api_key, api_version,
                                         throttle_time_ms=round(throttled * 1000)).frame
        return response

    return charge
