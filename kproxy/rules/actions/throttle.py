"""The ``throttle`` action: token buckets per client id, principal, topic or globally, as quotas.

YAML: ``- throttle: {bytes_per_second: 1e6, requests_per_second: 50, scope:
client_id|principal|topic|global, burst_seconds: 1}``. ``scope: principal`` is Kafka's user
quota: one bucket per authenticated principal (``User:alice``, whatever her client ids and
connections), and one shared by the connections whose principal is unknown (as Kafka's
``User:ANONYMOUS``). A request over its rate is held for the debt
(:class:`kproxy.rules.bucket.TokenBucket`, through :meth:`Throttle.charge`, in the engine's
buckets), and its answer reports in ``throttle_time_ms`` the throttle time a broker with that
quota would give it: its own bytes' share, not the wait behind requests pipelined ahead of it
(kproxy/rules/bucket.py); a Fetch under a byte rate is charged with its response's size instead
(:func:`charged_on_response`; the policy calls the charge when the response comes).

Its buckets are keyed (rule id, scope value, unit), so that a rule's buckets can be carried over
to the engine that replaces its own (:meth:`kproxy.rules.bucket.Buckets.adopt`).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.rules.actions.base import MAX_DURATION_S, HitKey, RuleAction
from kproxy.rules.yaml_nodes import Bad, NodeReader

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft
    from kproxy.rules.bucket import Buckets
    from kproxy.rules.request_facts import RequestFacts

# Bounds on the rates, so that nothing accepted overflows at run time: a throttle holds a request
# debt / rate seconds and reports that in an int32 throttle_time_ms, and a rate of 5e-324 bytes/s
# made that hold infinite (round(inf) ended the connection).
MIN_BYTES_PER_SECOND = 1.0
MIN_REQUESTS_PER_SECOND = 0.001  # one request every ~17 minutes
MAX_RATE = 1e15  # per second, bytes or requests: far above any link, and rate * burst stays finite
FETCH = 1  # ApiKey.FETCH, bound as a plain int: compared per throttled request


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
    shares_state: ClassVar[bool] = True

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
        buckets, facts = draft.buckets, draft.facts
        assert buckets is not None and facts is not None  # a throttle's verdict is never worked out ahead
        rule_id = key[0]
        if charged_on_response(facts.api_key, self):
            delay, reported, by_bytes = self._on_response(buckets, rule_id, facts)
            draft.charge_response(lambda size: by_bytes.charge(buckets, rule_id, facts, size)[1])
        else:
            delay, reported = self.charge(buckets, rule_id, facts, draft.request_size)
        if delay > 0:
            draft.hold(delay, key)
            draft.throttle_ms = max(draft.throttle_ms, round(reported * 1000))
            draft.count_throttled(rule_id, delay)
            draft.fault(key, f"held {delay * 1000:.1f}ms, throttle_time_ms {round(reported * 1000)}")

    def scopes(self, facts: RequestFacts) -> list[object]:
        """The scope values of the buckets a request of ``facts`` is charged to (one, or one per topic)."""
        if self.scope is ThrottleScope.GLOBAL:
            return [None]
        if self.scope is ThrottleScope.CLIENT_ID:
            return [facts.client_id]
        if self.scope is ThrottleScope.PRINCIPAL:
            return [("principal", facts.principal)]  # apart from a client id spelt like a principal
        return list(facts.topics()) or [None]

    def charge(self, buckets: Buckets, rule_id: str, facts: RequestFacts, nbytes: int) -> tuple[float, float]:
        """Record one request of ``nbytes`` against this throttle's buckets of rule ``rule_id``, at its
        turn (:mod:`kproxy.rules.bucket`); (the seconds to hold it, its throttle time in seconds: the
        response's ``throttle_time_ms`` as a broker with that quota reports it).

        Each the longest of the byte and request buckets; with a topic scope, the longest over
        the request's topics.
        """
        hold = reported = 0.0
        for scope in self.scopes(facts):
            if self.bytes_per_second is not None:
                h, t = buckets.charge((rule_id, scope, "bytes"), self.bytes_per_second, self.burst_s, nbytes,
                                      facts.now)
                hold, reported = max(hold, h), max(reported, t)
            if self.requests_per_second is not None:
                h, t = buckets.charge((rule_id, scope, "requests"), self.requests_per_second, self.burst_s, 1,
                                      facts.now)
                hold, reported = max(hold, h), max(reported, t)
        return hold, reported

    def whatif_hold_s(self, buckets: Buckets, rule_id: str, facts: RequestFacts, nbytes: int) -> float:
        return self.charge(buckets, rule_id, facts, nbytes)[0]

    def _on_response(self, buckets: Buckets, rule_id: str, facts: RequestFacts) -> tuple[float, float, Throttle]:
        """A Fetch under a byte rate: the seconds to hold it (the byte debt left by earlier responses,
        or its request rate's hold), the throttle time to report (the request rate's only: the byte
        debt was reported by the response that made it), and the byte rate alone."""
        by_bytes, by_requests = split_throttle(self)
        assert by_bytes is not None
        held, reported = by_requests.charge(buckets, rule_id, facts, 1) if by_requests is not None else (0.0, 0.0)
        debt = by_bytes.charge(buckets, rule_id, facts, 0)[0]  # nothing charged: what is owed now
        return max(debt, held), reported, by_bytes

    @property
    def has_live_state(self) -> bool:
        return self.scope is ThrottleScope.PRINCIPAL

    def live_state(self, elapsed_s: float, out: dict[str, Any]) -> None:
        if self.scope is ThrottleScope.PRINCIPAL:
            out["throttle_scope"] = "principal"


def charged_on_response(api_key: int, throttle: Throttle) -> bool:
    """Whether a throttle's byte rate is charged with this api's response sizes (Fetch) rather
    than its request sizes."""
    return api_key == FETCH and throttle.bytes_per_second is not None


def split_throttle(throttle: Throttle) -> tuple[Throttle | None, Throttle | None]:
    """(the byte rate alone, the request rate alone) of a throttle; None where it has none."""
    if throttle.bytes_per_second is None or throttle.requests_per_second is None:
        return ((throttle, None) if throttle.requests_per_second is None else (None, throttle))
    return (dataclasses.replace(throttle, requests_per_second=None),
            dataclasses.replace(throttle, bytes_per_second=None))
