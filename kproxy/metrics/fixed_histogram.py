"""A fixed-bucket histogram counted in plain Python (no lock, no label lookup per observation).

Buckets are counted per slot and made cumulative only when exported, the form Prometheus
expects (``le`` labels, ``+Inf`` last). The bucket bounds of kproxy's histograms are here too.
"""

from __future__ import annotations

from bisect import bisect_left

# Broker latency: from sub-millisecond produce acks to 30 s long-poll fetches.
BROKER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                  1.0, 2.5, 5.0, 10.0, 30.0)
# kproxy's own time per request: microseconds normally, milliseconds for big rewrites.
OVERHEAD_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                    0.025, 0.05, 0.1)
# How late the trio loop runs a due task (kproxy.server.loopwatch): 1 ms to 10 s; 0.1 s is the bound
# nothing may exceed (a stall every client feels).
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    """Cumulative-on-export histogram: ``counts[i]`` counts values <= ``bounds[i]``
    (and the last slot the rest); cumulated only when exported."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def add(self, other: Histogram) -> None:
        """Add ``other``'s observations (same bounds) to this one's."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.sum += other.sum

    def cumulative(self) -> list[tuple[str, float]]:
        out = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((_le(bound), float(running)))
        out.append(("+Inf", float(running + self.counts[-1])))
        return out


def _le(bound: float) -> str:
    return repr(bound)
