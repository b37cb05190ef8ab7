"""Token buckets for the ``throttle`` action, sans-IO: the caller passes the time.

A bucket works the way a Kafka broker quota does (KIP-13, KIP-124, KIP-219): usage is
recorded when the broker would take the request, and the throttle time is what
:func:`broker_throttle_s` gives for the rate observed over the bucket's window
(``burst_seconds``): the time the client must stay idle for that rate to fall back to
the quota, which is the time the bucket needs to pay the overdraft back.

A broker takes a client's requests one at a time and, once one is throttled, reads
nothing more from it until that throttle time has passed (its channel is muted,
KIP-219). So a request read while an earlier one's throttle runs is taken at the
throttle's end (its *turn*): its hold is the wait for its turn plus its own throttle,
and its ``throttle_time_ms`` is its own throttle alone, which a client pipelining
five requests is told as a broker would tell it (each request the time its own bytes
cost), not the wait of the whole queue ahead of it. The holds are those of a plain
bucket charged at read time (the same release times, so the same rate), only the
reported time differs.

What the ``throttle`` action (kproxy/rules/actions/throttle.py) charges, as a broker charges it
(KIP-13: produce quotas on the bytes a client sends, fetch quotas on the bytes it is sent):

* every request but Fetch: its own size, when it is read; the response is held for the debt and reports it;
* Fetch: the size of its response, when the broker's answer is seen. The
  response itself leaves as it came, reporting its throttle time in ``throttle_time_ms``
  (KIP-219: a broker answers at once and then stops reading the client's
  connection for that long); the *next* Fetch charged to the bucket is held for
  whatever debt is left when it is read, so the long-run rate is the bucket's
  whether or not the client backs off by itself.
* ``requests_per_second``: one token per request, when it is read, for every api.
"""

from __future__ import annotations

from collections.abc import Hashable


def broker_throttle_s(observed_rate: float, quota: float, window_s: float) -> float:
    """A Kafka broker's throttle time (KIP-13, KIP-124) in seconds: how long a client whose rate
    observed over a window of ``window_s`` seconds is ``observed_rate`` must stay idle for the rate
    over the stretched window to fall back to ``quota`` (X with observed * W / (W + X) = quota:
    (observed - quota) / quota * W); 0 when the rate is within the quota."""
    if observed_rate <= quota:
        return 0.0
    return (observed_rate - quota) / quota * window_s


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` saved; may go into debt.

    The bucket is a quota window of ``capacity / rate`` seconds: the usage it remembers is
    ``capacity - tokens`` (what the refill has not paid back yet), over that window.

    :meth:`charge` always records the amount (a request that already happened cannot be
    refused) at the request's turn (the end of the last throttle, or now if later: see the
    module docstring) and returns how long to hold it so that the long-run rate stays at
    ``rate``, and its own throttle time to report.
    """

    __slots__ = ("_stamp", "_tokens", "_turn", "capacity", "rate")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError("rate and capacity must be > 0")
        self.rate = rate
        self.capacity = capacity
        self._tokens = capacity
        self._stamp = now
        self._turn = now  # when the last throttle ends: the earliest the next request is taken

    def _refill(self, now: float) -> None:
        if now > self._stamp:  # a clock that goes backwards refills nothing
            self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now

    def charge(self, amount: float, now: float) -> tuple[float, float]:
        """Record ``amount`` tokens of a request read at ``now``, at its turn; (seconds to hold it
        from ``now``, its throttle time in seconds: :func:`broker_throttle_s` of the rate the window
        observes once it is recorded). Both are 0 when it is within the rate."""
        turn = self._turn if self._turn > now else now
        self._refill(turn)
        self._tokens -= amount
        window = self.capacity / self.rate
        throttle = broker_throttle_s((self.capacity - self._tokens) / window, self.rate, window) \
            if self._tokens < 0 else 0.0
        self._turn = turn + throttle
        return turn - now + throttle, throttle

    def take(self, amount: float, now: float) -> float:
        """:meth:`charge`'s hold alone: the delay in seconds (0 when within the rate)."""
        return self.charge(amount, now)[0]

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

    def charge(self, key: Hashable, rate: float, burst_s: float, amount: float, now: float) -> tuple[float, float]:
        """:meth:`TokenBucket.charge` on ``key``'s bucket (made full on first use)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self._max:
                del self._buckets[next(iter(self._buckets))]
            bucket = self._buckets[key] = TokenBucket(rate, rate * burst_s, now)
        return bucket.charge(amount, now)

    def adopt(self, other: Buckets, rule_ids: frozenset[str]) -> None:
        """Take ``other``'s buckets of the rules ``rule_ids`` (keys whose first item is one), as they are."""
        for key, bucket in other._buckets.items():
            if isinstance(key, tuple) and key and key[0] in rule_ids and key not in self._buckets:
                if len(self._buckets) >= self._max:
                    break
                self._buckets[key] = bucket

    def take(self, key: Hashable, rate: float, burst_s: float, amount: float, now: float) -> float:
        """:meth:`charge`'s hold alone."""
        return self.charge(key, rate, burst_s, amount, now)[0]

    def __len__(self) -> int:
        return len(self._buckets)
