"""Token buckets for the ``throttle`` action, sans-IO: the caller passes the time.

A bucket works the way a Kafka broker quota does (KIP-13, KIP-124): usage is
recorded when it happens, and a client over its rate is delayed by the time
the bucket needs to pay the overdraft back, which is also the
``throttle_time_ms`` to report in the response.

What is charged, as a broker charges it (KIP-13: produce quotas on the bytes
a client sends, fetch quotas on the bytes it is sent):

* every request but Fetch: its own size, when it is read (:func:`charged_on_response`
  is False); the response is held for the debt and reports it;
* Fetch: the size of its response, when the broker's answer is seen. The
  response itself leaves as it came, reporting the debt in ``throttle_time_ms``
  (KIP-219: a broker answers at once and then stops reading the client's
  connection for that long); the *next* Fetch charged to the bucket is held for
  whatever debt is left when it is read, so the long-run rate is the bucket's
  whether or not the client backs off by itself.
* ``requests_per_second``: one token per request, when it is read, for every api.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kproxy.rules.actions.throttle import Throttle

FETCH = 1  # ApiKey.FETCH, bound as a plain int: compared per throttled request


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


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` saved; may go into debt.

    :meth:`take` always records the amount (a request that already happened
    cannot be refused) and returns how many seconds the caller should hold it
    so that the long-run rate stays at ``rate``.
    """

    __slots__ = ("_stamp", "_tokens", "capacity", "rate")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError("rate and capacity must be > 0")
        self.rate = rate
        self.capacity = capacity
        self._tokens = capacity
        self._stamp = now

    def _refill(self, now: float) -> None:
        if now > self._stamp:  # a clock that goes backwards refills nothing
            self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now

    def take(self, amount: float, now: float) -> float:
        """Spend ``amount`` tokens at ``now``; the delay in seconds (0 when within the rate)."""
        self._refill(now)
        self._tokens -= amount
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def tokens(self, now: float) -> float:
        self._refill(now)
        return self._tokens


class Buckets:
    """Buckets created on first use, one per key (rule id, scope value, unit).

    Bounded: past ``max_buckets`` keys the oldest are forgotten (a client-id
    scope must not grow without limit under hostile client ids).
    """

    def __init__(self, max_buckets: int = 10_000) -> None:
        self._buckets: dict[Hashable, TokenBucket] = {}
        self._max = max_buckets

    def take(self, key: Hashable, rate: float, burst_s: float, amount: float, now: float) -> float:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self._max:
                del self._buckets[next(iter(self._buckets))]
            bucket = self._buckets[key] = TokenBucket(rate, rate * burst_s, now)
        return bucket.take(amount, now)

    def __len__(self) -> int:
        return len(self._buckets)
