"""Reading kproxy's event-loop lag in hostile tests: no scenario may hold the loop over 100 ms.

In process (:class:`~kproxy.testing.ProxyThread`), the server's :class:`~kproxy.server.loopwatch.LoopWatch`
keeps the worst lag it saw; for a kproxy subprocess, ``/metrics``' histogram tells how many
heartbeats came later than a bound.
"""

from __future__ import annotations

import re
import time

from kproxy.testing import ProxyThread

BLOCKED = 0.1  # the bound every hostile scenario is held to (kproxy.server.loopwatch.BLOCKED_AFTER)


def loop_lag_max(proxy: ProxyThread) -> float:
    """The worst event-loop lag of ``proxy`` since it started or since :func:`reset_loop_lag`, in seconds."""
    assert proxy.server is not None
    return float(proxy.call(lambda: proxy.server.loop_watch.max_lag))  # type: ignore[union-attr]


def reset_loop_lag(proxy: ProxyThread, warm_up_timeout: float = 20.0) -> None:
    """Start measuring afresh, once start-up is over: call it right before the scenario under test.

    Start-up (broker discovery, the first imports) is not a scenario: on a loaded 2-core machine it
    can hold the loop for a few tens of milliseconds at a time, which would blur the measurement.
    """
    server = proxy.server
    assert server is not None
    deadline = time.monotonic() + warm_up_timeout
    while not proxy.call(server.warmed.is_set) and time.monotonic() < deadline:
        time.sleep(0.05)
    proxy.call(server.loop_watch.reset_max)


_BUCKET = re.compile(r'^kproxy_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$', re.MULTILINE)
_COUNT = re.compile(r"^kproxy_event_loop_lag_seconds_count (\S+)$", re.MULTILINE)


def stalls_over(metrics_text: str, seconds: float) -> int:
    """Heartbeats later than ``seconds`` in a ``/metrics`` page (``seconds`` must be a bucket bound)."""
    buckets = {float(le): float(n) for le, n in _BUCKET.findall(metrics_text)}
    if seconds not in buckets:
        raise ValueError(f"{seconds} is not a bucket bound of kproxy_event_loop_lag_seconds: {sorted(buckets)}")
    count = _COUNT.search(metrics_text)
    if count is None:
        raise ValueError("no kproxy_event_loop_lag_seconds in this /metrics page")
    return int(float(count.group(1)) - buckets[seconds])
