"""``kproxy demo``'s first part against the real broker: the traffic view (issue 24) it prints is
kproxy's /metrics read over HTTP, and each figure agrees with what the demo's clients did."""

from __future__ import annotations

import io
import re

from kproxy.subcommands.demo import CODECS, run_demo
from kproxy.subcommands.demo_traffic import parse
from kproxy.testing import Broker

EXPOSITION = """\
# TYPE kproxy_topic_bytes_total counter
kproxy_topic_bytes_total{topic="t",direction="produce"} 120.0
# TYPE kproxy_topic_records_total counter
kproxy_topic_records_total{topic="t",direction="produce"} 3.0
# TYPE kproxy_client_records_total counter
kproxy_client_records_total{client_id="c",direction="fetch"} 7.0
# TYPE kproxy_consumergroup_lag_sum gauge
kproxy_consumergroup_lag_sum{group="g",topic="t"} 5.0
# TYPE kproxy_consumergroup_lag_seconds gauge
kproxy_consumergroup_lag_seconds{group="g",topic="t"} 2.5
# TYPE kproxy_client_anomalies_total counter
kproxy_client_anomalies_total{kind="stale_generation",client_id="c"} 2.0
kproxy_client_anomalies_total{kind="producer_fenced",client_id="c"} 0.0
# TYPE kproxy_requests_total counter
kproxy_requests_total{api="produce",version="9",node_id="1"} 2.0
"""


def test_parse_pairs_records_with_bytes_and_ignores_other_families() -> None:
    view = parse(EXPOSITION)
    assert view.topics == {("t", "produce"): (3.0, 120.0)}
    assert view.clients == {("c", "fetch"): (7.0, 0.0)}  # a family without its twin counts 0, not missing
    assert view.lag == {("g", "t"): 5.0} and view.lag_seconds == {("g", "t"): 2.5}
    assert view.anomalies == {("stale_generation", "c"): 2.0}  # (a kind at 0 is no anomaly)
    assert view.batches == {} and view.software == {}


def test_the_demo_prints_traffic_by_topic_client_producer_and_lag_as_the_clients_made_it(tansu: Broker) -> None:
    out = io.StringIO()
    assert run_demo(tansu.bootstrap, out, messages=250, rules=False) == 0
    text = out.getvalue()
    topic = re.search(r"^  (kproxy-demo-[0-9a-f]{8}) +produce +(\d+) +(\d+)$", text, re.M)
    assert topic is not None, text
    assert int(topic.group(2)) == 250, "every record produced counted once on its topic"
    per_codec = 250 // len(CODECS)
    for codec in CODECS:
        line = re.search(rf"^  kproxy-demo-producer-{codec} +produce +(\d+) +(\d+)$", text, re.M)
        assert line is not None and int(line.group(1)) == per_codec, (codec, text)
        assert re.search(rf"^    kproxy-demo-producer-{codec} +{codec} +acks=-1 +[1-9]\d*$", text, re.M), codec
    # The producers' bytes add up to the topic's: the same batches counted by client and by topic.
    client_bytes = sum(int(m.group(1)) for m in re.finditer(r"^  kproxy-demo-producer-\w+ +produce +\d+ +(\d+)$",
                                                             text, re.M))
    assert client_bytes == int(topic.group(3))
    assert re.search(r"kproxy-demo-stopped: confluent-kafka-python \S+ \(\d+ connections?\)", text)
    lag = re.search(r"read half and stopped: on the \d partition\(s\) it committed, produced (\d+) - committed (\d+)"
                    r" = (\d+); kproxy: (\S+) \((\w+)\)", text)
    assert lag is not None, text
    produced, committed, expected = (int(lag.group(i)) for i in (1, 2, 3))
    assert committed == 250 // 2 and expected == produced - committed > 0
    assert (lag.group(4), lag.group(5)) == (str(expected), "same")
    # Its lag in seconds: the oldest record it had not committed, dated by the producer's delivery report.
    late = re.search(r"stopped's oldest record not committed was written (\S+) s before the scrape \(its CreateTime\); "
                     r"kproxy: (\S+) s \(([\w .]+)\)", text)
    assert late is not None, text
    assert float(late.group(1)) > 0 and late.group(3) == "within 1.5 s", late.group(0)
    # Clean traffic: no client anomaly.
    assert "client anomalies (kproxy_client_anomalies_total; none on clean traffic):\n    none\n" in text, text
