"""End to end with kcat, the command-line client: metadata, produce, consume, groups, through kproxy.

Debian's kcat 1.7.1 runs on Debian's librdkafka 2.0.2, which cannot read the
tagged fields (the KIP-584 feature fields) at the end of Tansu's ApiVersions v3
answer: it fails with "Read underflow" and never gets further, directly as much
as through kproxy. The fixture checks that against Tansu itself, without kproxy;
if so, it runs the same kcat binary on the newer librdkafka that the
confluent-kafka wheel ships (kcat links librdkafka.so.1 dynamically), and skips
only if kcat cannot talk to Tansu directly either way.
``test_stock_kcat_is_the_same_through_kproxy`` keeps the stock pairing honest:
whatever it does against Tansu, it does through kproxy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from kproxy.testing import Broker, ProxyThread
from tests.support.e2e import (
    TANSU_NODE_ID,
    assert_kproxy_endpoint,
    connections_total,
    consume_confluent,
    create_topic,
    fetch_batch_codecs,
    no_protocol_errors_in_kproxy,
    produce_confluent,
    unique,
)

KCAT = shutil.which("kcat")
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
TIMEOUT = 60  # seconds, for any one kcat run

pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (scripts/system-deps installs it)")



@pytest.fixture(autouse=True)
def _no_protocol_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with no_protocol_errors_in_kproxy(caplog):
        yield


@dataclass
class Kcat:
    env: dict[str, str]
    librdkafka: str  # which library it runs on, for messages

    def run(self, *args: str, stdin: str | None = None, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
        assert KCAT is not None
        return subprocess.run([KCAT, *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                              env=self.env, check=False)

    def ok(self, *args: str, stdin: str | None = None) -> str:
        done = self.run(*args, stdin=stdin)
        assert done.returncode == 0, f"kcat {' '.join(args)} failed ({self.librdkafka}):\n{done.stderr[-2000:]}"
        return done.stdout


def _wheel_librdkafka() -> Path | None:
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*")) if libs.is_dir() else []
    return found[0] if found else None


def _lists(kcat: Kcat, bootstrap: str) -> subprocess.CompletedProcess[str]:
    # A short metadata timeout: a kcat that cannot talk to the broker gives up in 3 s.
    return kcat.run("-b", bootstrap, "-L", "-m", "3", timeout=30)


@pytest.fixture(scope="module")
def stock_kcat() -> Kcat:
    return Kcat(dict(os.environ), "the system librdkafka")


@pytest.fixture(scope="module")
def stock_direct(stock_kcat: Kcat, tansu: Broker) -> subprocess.CompletedProcess[str]:
    """Stock kcat's ``-L`` against Tansu itself, no kproxy involved."""
    return _lists(stock_kcat, tansu.bootstrap)


@pytest.fixture(scope="module")
def kcat(tansu: Broker, stock_kcat: Kcat, stock_direct: subprocess.CompletedProcess[str]) -> Iterator[Kcat]:
    """A kcat that works against Tansu directly (checked without kproxy)."""
    direct = stock_direct
    if direct.returncode == 0:
        yield stock_kcat
        return
    lib = _wheel_librdkafka()
    if lib is None:
        pytest.skip("kcat cannot talk to Tansu directly, without kproxy (its librdkafka cannot read Tansu's "
                    f"ApiVersions answer): {direct.stderr.strip()[-300:]}")
    with tempfile.TemporaryDirectory(prefix="kcat-rdkafka-") as tmp:
        (Path(tmp) / "librdkafka.so.1").symlink_to(lib)
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = tmp + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        newer = Kcat(env, f"librdkafka from the confluent-kafka wheel ({lib.name})")
        again = _lists(newer, tansu.bootstrap)
        if again.returncode != 0:
            pytest.skip("kcat cannot talk to Tansu directly, without kproxy, on either librdkafka: "
                        f"{direct.stderr.strip()[-200:]} / {again.stderr.strip()[-200:]}")
        yield newer


def test_stock_kcat_is_the_same_through_kproxy(stock_kcat: Kcat, stock_direct: subprocess.CompletedProcess[str],
                                               proxy: ProxyThread, tansu: Broker) -> None:
    """Debian's kcat as it is: kproxy neither causes nor hides what it does against Tansu."""
    direct = stock_direct
    proxied = _lists(stock_kcat, proxy.bootstrap)
    assert proxied.returncode == direct.returncode, (direct.stderr[-500:], proxied.stderr[-500:])
    if direct.returncode != 0:
        assert "ApiVersion" in direct.stderr and "ApiVersion" in proxied.stderr, proxied.stderr[-500:]
    else:
        assert f"broker {TANSU_NODE_ID} at 127.0.0.1:" in proxied.stdout
        assert f":{tansu.port}" not in proxied.stdout
    assert connections_total(proxy) >= 1


def test_kcat_lists_metadata_with_kproxy_addresses(kcat: Kcat, proxy: ProxyThread, tansu: Broker) -> None:
    topic = unique("e2e-kcat-l")
    create_topic(proxy.bootstrap, topic, partitions=3)
    before = connections_total(proxy)
    out = kcat.ok("-b", proxy.bootstrap, "-L", "-t", topic, "-m", "15")
    assert f'topic "{topic}" with 3 partitions' in out, out
    broker_lines = [line.split() for line in out.splitlines() if line.strip().startswith("broker ")]
    assert broker_lines, out
    for words in broker_lines:  # "broker 111 at 127.0.0.1:40123 (controller)"
        assert words[1] == str(TANSU_NODE_ID)
        host, port = words[3].rsplit(":", 1)
        assert_kproxy_endpoint(proxy, tansu, host, int(port), "kcat -L broker")
    assert f":{tansu.port}" not in out
    assert connections_total(proxy) > before, "kcat did not connect through kproxy"


def test_kcat_json_metadata_names_only_kproxy(kcat: Kcat, proxy: ProxyThread, tansu: Broker) -> None:
    topic = unique("e2e-kcat-j")
    create_topic(proxy.bootstrap, topic, partitions=2)
    doc = json.loads(kcat.ok("-b", proxy.bootstrap, "-L", "-J", "-m", "15"))
    names = [b["name"] for b in doc["brokers"]] + [doc["originating_broker"]["name"].rsplit("/", 1)[0]]
    assert [b["id"] for b in doc["brokers"]] == [TANSU_NODE_ID]
    for name in names:
        host, port = name.rsplit(":", 1)
        assert_kproxy_endpoint(proxy, tansu, host, int(port), f"kcat -L -J broker {name!r}")
    assert doc["controllerid"] == TANSU_NODE_ID
    [described] = [t for t in doc["topics"] if t["topic"] == topic]
    assert sorted(p["partition"] for p in described["partitions"]) == [0, 1]
    assert all(p["leader"] == TANSU_NODE_ID for p in described["partitions"])
    assert str(tansu.port) not in json.dumps(doc["brokers"])


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_kcat_produces_and_consumes(kcat: Kcat, proxy: ProxyThread, tansu: Broker, codec: str) -> None:
    topic = unique(f"e2e-kcat-{codec}")
    create_topic(proxy.bootstrap, topic, partitions=3)
    sent = {f"key-{i:04d}": f"value {i} " + "x" * (i % 50) for i in range(120)}
    lines = "".join(f"{k}\t{v}\n" for k, v in sent.items())
    kcat.ok("-b", proxy.bootstrap, "-P", "-t", topic, "-K", "\t", "-z", codec, "-X", "acks=all",
            "-X", "linger.ms=20", stdin=lines)
    assert set(fetch_batch_codecs(proxy.bootstrap, topic, 3)) == {CODEC_IDS[codec]}

    # kcat reads it all back, as JSON, then exits at the end of every partition.
    out = kcat.ok("-b", proxy.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-J", "-q")
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert sorted((r["key"], r["payload"]) for r in records) == sorted(sent.items())
    assert {r["partition"] for r in records} <= {0, 1, 2}
    assert all(r["broker"] == TANSU_NODE_ID for r in records)
    # ... and so does a librdkafka consumer of another kind.
    got = consume_confluent(proxy.bootstrap, topic, 3, len(sent))
    assert sorted((k.decode(), v.decode()) for k, v in got if k and v) == sorted(sent.items())
    assert len(got) == len(sent)


def test_kcat_consumes_what_python_clients_produced(kcat: Kcat, proxy: ProxyThread, tansu: Broker) -> None:
    topic = unique("e2e-kcat-c")
    create_topic(proxy.bootstrap, topic, partitions=2)
    sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(50)]
    produce_confluent(proxy.bootstrap, topic, sent, acks="all", **{"compression.type": "zstd"})
    out = kcat.ok("-b", proxy.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k=%s\\n")
    assert sorted(out.splitlines()) == sorted(f"{k.decode()}={v.decode()}" for k, v in sent)


def test_kcat_group_consumer_commits(kcat: Kcat, proxy: ProxyThread, tansu: Broker) -> None:
    topic, group = unique("e2e-kcat-g"), unique("e2e-kcat-grp")
    create_topic(proxy.bootstrap, topic, partitions=2)
    sent = [(f"g{i}".encode(), f"w{i}".encode()) for i in range(40)]
    produce_confluent(proxy.bootstrap, topic, sent, acks="all")
    out = kcat.ok("-b", proxy.bootstrap, "-G", group, topic, "-e", "-q", "-f", "%k=%s\\n",
                  "-X", "auto.offset.reset=earliest", "-X", "session.timeout.ms=6000",
                  "-X", "heartbeat.interval.ms=1000")
    assert sorted(out.splitlines()) == sorted(f"{k.decode()}={v.decode()}" for k, v in sent)
    # kcat commits on its way out; the group's offsets cover every record, seen through kproxy.
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                               request_timeout=15)[group].result(timeout=20)
    committed = {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic}
    assert sum(committed.values()) == len(sent), committed
