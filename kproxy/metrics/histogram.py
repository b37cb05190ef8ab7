"""A fixed-bucket histogram counted in plain Python (no lock, no label lookup per observation).

Buckets are counted per slot and made cumulative only when exported, the form Prometheus
expects (``le`` labels, ``+Inf`` last).
"""

from __future__ import annotations

from bisect import bisect_left


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
