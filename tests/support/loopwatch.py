"""Reading kproxy's event-loop lag in hostile tests: no scenario may hold the loop over 100 ms.

In process (:class:`~kproxy.testing.ProxyThread`), the server's :class:`~kproxy.server.loopwatch.LoopWatch`
keeps the worst lag and the worst hold it saw; for a kproxy subprocess, ``/metrics``' histograms
tell how many heartbeats came later than a bound. Hostile scenarios bound the **hold** (the lag
less the loop thread's wait for a CPU): what kproxy's work did to the loop, not what the other
processes of a loaded test machine did to its thread.
"""

from __future__ import annotations

import re
import time

from kproxy.testing import ProxyThread

BLOCKED = 0.1  # the bound every hostile scenario is held to (kproxy.server.loopwatch.BLOCKED_AFTER)


LAG = "kproxy_event_loop_lag_seconds"
HELD = "kproxy_event_loop_held_seconds"


def loop_lag_max(proxy: ProxyThread) -> float:
    """The worst event-loop lag of ``proxy`` since it started or since :func:`reset_loop_lag`, in seconds."""
    assert proxy.server is not None
    return float(proxy.call(lambda: proxy.server.loop_watch.max_lag))  # type: ignore[union-attr]


def loop_held_max(proxy: ProxyThread) -> float:
    """The longest ``proxy``'s own work held its event loop since it started or since :func:`reset_loop_lag`."""
    assert proxy.server is not None
    return float(proxy.call(lambda: proxy.server.loop_watch.max_held))  # type: ignore[union-attr]


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


def stalls_over(metrics_text: str, seconds: float, family: str = HELD) -> int:
    """Heartbeats held (or, with ``family=LAG``, late) longer than ``seconds`` in a ``/metrics`` page
    (``seconds`` must be a bucket bound)."""
    bucket = re.compile(rf'^{family}_bucket\{{le="([^"]+)"\}} (\S+)$', re.MULTILINE)
    buckets = {float(le): float(n) for le, n in bucket.findall(metrics_text)}
    if seconds not in buckets:
        raise ValueError(f"{seconds} is not a bucket bound of {family}: {sorted(buckets)}")
    count = re.search(rf"^{family}_count (\S+)$", metrics_text, re.MULTILINE)
    if count is None:
        raise ValueError(f"no {family} in this /metrics page")
    return int(float(count.group(1)) - buckets[seconds])
