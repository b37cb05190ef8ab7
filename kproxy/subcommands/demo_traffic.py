"""The demo's traffic view: what kproxy's ``/metrics`` says of topics, clients, producers,
consumer lag (in records and in seconds) and client anomalies, read over HTTP as a Prometheus
server would, with no access to the broker.

The demo turns on the per-topic and per-client labels (``metrics.topic_label``,
``metrics.client_id_label``) and scrapes its kproxy while a consumer group that stopped half-way
is still connected, so every traffic and consumer-lag family has something to show.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

from prometheus_client.parser import text_string_to_metric_families

# The options the demo's first kproxy runs with (config paths, ``__`` for dots), /metrics on a free port.
TRAFFIC_OPTIONS = {
    "metrics__topic_label": True,
    "metrics__client_id_label": True,
}


@dataclass
class TrafficView:
    """The samples of the traffic families, keyed by their labels (as /metrics spells them)."""

    topics: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # (topic, direction)
    clients: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # (client_id, direction)
    batches: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (client_id, compression, acks)
    software: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (client_id, name, version)
    lag: dict[tuple[str, str], float] = field(default_factory=dict)  # (group, topic)
    lag_seconds: dict[tuple[str, str], float] = field(default_factory=dict)  # (group, topic)
    anomalies: dict[tuple[str, str], float] = field(default_factory=dict)  # (kind, client_id)


def scrape(port: int, timeout: float = 10.0) -> str:
    """The text of ``http://127.0.0.1:PORT/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as answer:
        text: str = answer.read().decode()
    return text


def parse(text: str) -> TrafficView:
    """The traffic families of an exposition text; other families are ignored."""
    view = TrafficView()
    bytes_: dict[str, dict[tuple[str, str], float]] = {"topic": {}, "client_id": {}}
    records: dict[str, dict[tuple[str, str], float]] = {"topic": {}, "client_id": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            name = sample.name
            if name in ("kproxy_topic_bytes_total", "kproxy_client_bytes_total"):
                key = "topic" if name.startswith("kproxy_topic") else "client_id"
                bytes_[key][(labels[key], labels["direction"])] = sample.value
            elif name in ("kproxy_topic_records_total", "kproxy_client_records_total"):
                key = "topic" if name.startswith("kproxy_topic") else "client_id"
                records[key][(labels[key], labels["direction"])] = sample.value
            elif name == "kproxy_produce_batches_total":
                view.batches[(labels["client_id"], labels["compression"], labels["acks"])] = sample.value
            elif name == "kproxy_client_info":
                view.software[(labels["client_id"], labels["software_name"], labels["software_version"])] = \
                    sample.value
            elif name == "kproxy_consumergroup_lag_sum":
                view.lag[(labels["group"], labels["topic"])] = sample.value
            elif name == "kproxy_consumergroup_lag_seconds":
                view.lag_seconds[(labels["group"], labels["topic"])] = sample.value
            elif name == "kproxy_client_anomalies_total" and sample.value:
                view.anomalies[(labels["kind"], labels["client_id"])] = sample.value
    for key, target in (("topic", view.topics), ("client_id", view.clients)):
        for labels_key in bytes_[key].keys() | records[key].keys():
            target[labels_key] = (records[key].get(labels_key, 0.0), bytes_[key].get(labels_key, 0.0))
    return view


@dataclass
class LagTruth:
    """What the clients did, over the partitions the stopped group committed: the records the
    producers had acknowledged there, and the group's committed offsets (a new topic: offsets
    start at 0, so the records produced to a partition are its end offset); and, in seconds, how long
    before the scrape the oldest record the group had not committed was written (its CreateTime, from
    the producer's delivery report; None: none known)."""

    group: str
    topic: str
    partitions: int
    produced: int
    committed: int
    behind_seconds: float | None = None


def report(view: TrafficView, truth: LagTruth | None, out: TextIO) -> None:
    """Print the traffic view as the demo's third table, beside what the clients themselves know."""
    w = out.write
    w("\ntraffic read from the wire (kproxy's /metrics; no broker access needed):\n")
    w(f"  {'topic':<36}{'direction':>10}{'records':>10}{'bytes':>12}\n")
    for (topic, direction), (n, size) in sorted(view.topics.items()):
        w(f"  {topic:<36}{direction:>10}{n:>10.0f}{size:>12.0f}\n")
    w(f"  {'client id':<36}{'direction':>10}{'records':>10}{'bytes':>12}\n")
    for (client, direction), (n, size) in sorted(view.clients.items()):
        w(f"  {client:<36}{direction:>10}{n:>10.0f}{size:>12.0f}\n")
    w("  producer batches (client id, compression, acks):\n")
    for (client, codec, acks), n in sorted(view.batches.items()):
        w(f"    {client:<34}{codec:>8}  acks={acks:<4}{n:>6.0f}\n")
    w("  clients connected at the scrape (software as the client library names itself):\n")
    _lines(out, (f"{client}: {name} {version} ({n:.0f} connection{'s' if n != 1 else ''})"
                 for (client, name, version), n in sorted(view.software.items())))
    w("  consumer lag (kproxy_consumergroup_lag_sum):\n")
    _lines(out, (f"{group} on {topic}: {lag:.0f}" for (group, topic), lag in sorted(view.lag.items())))
    if truth is not None:
        expected = truth.produced - truth.committed
        seen = view.lag.get((truth.group, truth.topic))
        verdict = "same" if seen == expected else "DIFFERENT"
        w(f"  {truth.group} read half and stopped: on the {truth.partitions} partition(s) it committed, "
          f"produced {truth.produced} - committed {truth.committed} = {expected}; "
          f"kproxy: {'-' if seen is None else f'{seen:.0f}'} ({verdict})\n")
    w("  consumer lag in seconds (kproxy_consumergroup_lag_seconds: how long ago the oldest record not committed "
      "was written):\n")
    _lines(out, (f"{group} on {topic}: {late:.1f} s" for (group, topic), late in sorted(view.lag_seconds.items())))
    if truth is not None and truth.behind_seconds is not None:
        late = view.lag_seconds.get((truth.group, truth.topic))
        # (kproxy keeps a write time a second per partition: within about a second of the record's own)
        verdict = "-" if late is None else "within 1.5 s" if abs(late - truth.behind_seconds) <= 1.5 else "DIFFERENT"
        w(f"  {truth.group}'s oldest record not committed was written {truth.behind_seconds:.1f} s before the "
          f"scrape (its CreateTime); kproxy: {'-' if late is None else f'{late:.1f} s'} ({verdict})\n")
    w("  client anomalies (kproxy_client_anomalies_total; none on clean traffic):\n")
    _lines(out, (f"{kind} by {client}: {n:.0f}" for (kind, client), n in sorted(view.anomalies.items())))


def _lines(out: TextIO, lines: Iterable[str]) -> None:
    wrote = False
    for line in lines:
        out.write(f"    {line}\n")
        wrote = True
    if not wrote:
        out.write("    none\n")
