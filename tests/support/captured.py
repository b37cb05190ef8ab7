"""A real capture: kproxy with capture on, librdkafka producing and consuming through it, to Tansu.

Made once per test session (:func:`tests.conftest.captured_run`) and read by the
capture tests and by the analysis tests, which check their figures against
what was sent here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kproxy.testing import Broker, running_proxy
from tests.support.e2e import consume_confluent, create_topic, produce_confluent, unique

PARTITIONS = 3
RECORDS = 600
PRODUCER_ID = "capture-producer"


@dataclass(frozen=True)
class CapturedRun:
    directory: Path
    topic: str
    records: int
    partitions: int
    received: int
    requests: dict[str, int]  # kproxy's own request counters by api (metrics), to cross-check the capture
    records_counted: dict[str, int]  # kproxy's own record counters by api (metrics)
    written: int
    dropped: int


def make_capture(tansu: Broker, directory: Path) -> CapturedRun:
    topic = unique("captured")
    create_topic(tansu.bootstrap, topic, partitions=PARTITIONS)  # straight to the broker: not captured
    messages = [(f"k{i}".encode(), b"v" * (10 + i % 50)) for i in range(RECORDS)]
    with running_proxy(tansu.bootstrap, capture__dir=str(directory)) as proxy:
        producer = produce_confluent(proxy.bootstrap, topic, messages, **{"client.id": PRODUCER_ID,
                                                                        "linger.ms": 5})
        del producer
        got = consume_confluent(proxy.bootstrap, topic, PARTITIONS, RECORDS)
        server: Any = proxy.server
    # Read once kproxy has stopped: every connection closed, nothing more can be counted or captured
    # (librdkafka's background Metadata refreshes would otherwise race a snapshot taken earlier).
    stats = server.stats
    requests: dict[str, int] = {}
    for (api, _version), n in stats.totals().requests.items():  # every broker's
        requests[api] = requests.get(api, 0) + n
    records_counted = dict(stats.records)
    capture = server.capture
    return CapturedRun(directory=directory, topic=topic, records=RECORDS, partitions=PARTITIONS, received=len(got),
                       requests=requests, records_counted=records_counted, written=capture.writer.written,
                       dropped=capture.writer.dropped)
