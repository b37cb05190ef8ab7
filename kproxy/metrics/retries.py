"""Retry storms read off the wire: idempotent producers sending the same batches again and again.

A batch an idempotent producer sends again (its retry after an error or a lost answer, or a
re-send on a new connection after it gave up on one with requests in flight) carries the same
producer id, base sequence and CRC as the first time. :class:`RetryWatch` remembers the batches of
the last minute by those three (read from each v2 batch header of a Produce request's records
ranges, which the exchange's scan found: a non-idempotent batch, producer id -1, costs one read),
and counts ``retry_storm`` for a client id whose batches sent again within one minute reach
``retries_per_minute`` (once per such minute). One retry after a leader change is a client doing
its job; a storm is a client that keeps failing (a broker refusing, a timeout shorter than the
broker's answers).

Bounded: at most :data:`MAX_BATCHES` batches are remembered (the oldest dropped first, as they
leave the minute), and per-client windows are keyed by the capped client id label.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from kproxy.metrics.client_anomalies import RETRY_STORM, ClientAnomalies, MinuteWindow
from kproxy.metrics.labels import OTHER
from kproxy.protocol.records import v2_producer_head
from kproxy.protocol.scan import RecordsRange

WINDOW: Final = 60.0  # seconds
MAX_BATCHES: Final = 100_000


class RetryWatch:
    """Idempotent batches of the last minute, and each client id's batches sent again (sans-IO)."""

    __slots__ = ("anomalies", "batches", "threshold", "windows")

    def __init__(self, anomalies: ClientAnomalies, retries_per_minute: int) -> None:
        self.anomalies = anomalies
        self.threshold = retries_per_minute
        self.batches: OrderedDict[tuple[int, int, int], float] = OrderedDict()  # (pid, seq, crc) -> first sent
        self.windows: dict[str, MinuteWindow] = {}

    def produce(self, frame: bytes, ranges: list[RecordsRange], client_id: str | None, now: float) -> None:
        """A Produce request's records ranges, read at ``now`` from ``client_id``'s connection."""
        for start, end, _ in ranges:
            # (the capture reads a batch's producer with the same function: the report replays this)
            head = v2_producer_head(frame, start, end)
            if head is None or head[0] < 0:
                continue  # a legacy message set, or not idempotent: nothing to tell a retry by
            key = (head[0], head[2], head[3])  # producer id, base sequence, CRC
            first = self.batches.get(key)
            if first is not None and now - first < WINDOW:
                self._again(client_id, now)
            else:
                self.batches[key] = now
                self.batches.move_to_end(key)
        self._forget(now)

    def _again(self, client_id: str | None, now: float) -> None:
        label = self.anomalies.clients(client_id or "")
        if label == OTHER:
            return  # past the cap: many clients' batches together say nothing of one of them
        window = self.windows.get(label)
        if window is None or now - window.start >= WINDOW:
            window = self.windows[label] = MinuteWindow(now)
        window.count += 1
        if window.count == self.threshold:
            self.anomalies.seen(RETRY_STORM, client_id, f"{window.count} batches sent again within a minute")

    def _forget(self, now: float) -> None:
        batches = self.batches
        while batches:
            key, first = next(iter(batches.items()))
            if now - first < WINDOW and len(batches) <= MAX_BATCHES:
                return
            del batches[key]
