"""Codec benchmark: kproxy.protocol side by side with kio (0.6.5) on the same bytes.

    .venv/bin/python bench/bench_codec.py [--repeats N] [--quick] [--loop-seconds S]

Prints Markdown tables (paste them into docs/PERFORMANCE.md):

(a) request header decode per frame, frames/s on one core;
(b) full decode and full encode of a Metadata response, v12 (flexible) and v1
    (non-flexible), with 1,000 and 100,000 partitions (3 brokers, topics of 100
    partitions each, replicas and ISR [0, 1, 2]);
(c) rewriting its broker list: kproxy's splice_body against a full
    decode + edit + encode (kproxy's own, and kio's, which has no splice);
(d) scan_body (the partial decode of the hot path) of the same bytes.

Before anything is timed, both codecs decode the same input and are checked to
agree (broker hosts and ports, topic names, partition count), and each encoder
must give back the input byte for byte, so the comparison is fair.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import fmt_ms, fmt_rate, machine_line, side_by_side, table, verdict
from kio.schema.metadata.v1.response import MetadataResponse as KioMetadataV1
from kio.schema.metadata.v12.response import MetadataResponse as KioMetadataV12
from kio.schema.request_header.v1.header import RequestHeader as KioHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioHeaderV2
from kio.serial import entity_reader, entity_writer

from kproxy.protocol import (
    MessageType,
    decode_body,
    default_body,
    encode_body,
    peek_request,
    scan_body,
    splice_body,
)
from kproxy.protocol.codes import all_api_keys
from kproxy.protocol.framing import FrameSplitter
from kproxy.protocol.headers import RequestHeader, decode_request_header, encode_request_header
from kproxy.protocol.message_schemas import supported_versions
from kproxy.protocol.messages import codec
from kproxy.protocol.payloads import encode_response
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap

METADATA = 3
RESP = MessageType.RESPONSE
BROKERS = 3
PARTITIONS_PER_TOPIC = 100
NEW_HOST = "kproxy.example.internal"
HEADER_TARGET = 500_000  # frames/s
SPLICE_TARGET = {1_000: 0.001, 100_000: 0.050}  # seconds


# -- input ------------------------------------------------------------------------------
def metadata_body(version: int, partitions: int) -> dict[str, Any]:
    """A Metadata response body of ``version`` with exactly the fields that version has."""
    schema = codec(METADATA, version, RESP).schema  # type: ignore[union-attr]
    by_name = {f.name: f for f in schema.fields}
    topic_fields = {f.name for f in by_name["topics"].fields or ()}
    part_fields = {f.name for f in next(f for f in by_name["topics"].fields or () if f.name == "partitions").fields
                   or ()}
    body = default_body(METADATA, version, RESP)
    body["brokers"] = [{"node_id": i, "host": f"broker-{i}.kafka.internal", "port": 9092, "rack": None}
                       for i in range(BROKERS)]
    if "cluster_id" in body:
        body["cluster_id"] = "bench-cluster"
    body["controller_id"] = 0
    topics = []
    for t in range(partitions // PARTITIONS_PER_TOPIC):
        topic: dict[str, Any] = {"error_code": 0, "name": f"topic-{t:05d}", "topic_id": uuid.UUID(int=t + 1),
                                 "is_internal": False, "topic_authorized_operations": -2147483648}
        plist = []
        for p in range(PARTITIONS_PER_TOPIC):
            part = {"error_code": 0, "partition_index": p, "leader_id": p % BROKERS, "leader_epoch": 0,
                    "replica_nodes": [0, 1, 2], "isr_nodes": [0, 1, 2], "offline_replicas": []}
            plist.append({k: v for k, v in part.items() if k in part_fields})
        topic["partitions"] = plist
        topics.append({k: v for k, v in topic.items() if k in topic_fields})
    body["topics"] = topics
    return body


KIO_TYPES = {1: KioMetadataV1, 12: KioMetadataV12}


def kio_decode(version: int, data: bytes) -> Any:
    entity, size = entity_reader(KIO_TYPES[version])(data, 0)
    assert size == len(data), (size, len(data))
    return entity


def kio_encode(version: int, entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(KIO_TYPES[version])(buf, entity)
    return buf.getvalue()


def kproxy_edit_brokers(brokers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, b in enumerate(brokers):
        b["host"] = NEW_HOST
        b["port"] = 30000 + i
    return brokers


def kio_edit_brokers(entity: Any) -> Any:
    brokers = tuple(dataclasses.replace(b, host=NEW_HOST, port=30000 + i) for i, b in enumerate(entity.brokers))
    return dataclasses.replace(entity, brokers=brokers)


def verify(version: int, partitions: int, data: bytes) -> None:
    """Both codecs read the same content from ``data``, and both encoders give it back exactly."""
    ours = decode_body(METADATA, version, RESP, data)
    theirs = kio_decode(version, data)
    assert [(b["node_id"], b["host"], b["port"]) for b in ours["brokers"]] == \
        [(b.node_id, b.host, b.port) for b in theirs.brokers], "broker lists differ"
    assert [t["name"] for t in ours["topics"]] == [t.name for t in theirs.topics], "topics differ"
    n_ours = sum(len(t["partitions"]) for t in ours["topics"])
    n_theirs = sum(len(t.partitions) for t in theirs.topics)
    assert n_ours == n_theirs == partitions, (n_ours, n_theirs, partitions)
    last_ours = ours["topics"][-1]["partitions"][-1]
    last_theirs = theirs.topics[-1].partitions[-1]
    assert (last_ours["leader_id"], last_ours["replica_nodes"]) == \
        (last_theirs.leader_id, list(last_theirs.replica_nodes)), "partition contents differ"
    assert encode_body(METADATA, version, RESP, ours) == data, "kproxy encode is not byte-exact"
    assert kio_encode(version, theirs) == data, "kio encode is not byte-exact"
    # The three broker rewrites must produce the same bytes.
    spliced, done = splice_body(METADATA, version, RESP, data, {"brokers": kproxy_edit_brokers})
    assert done == ["brokers"]
    full = decode_body(METADATA, version, RESP, data)
    full["brokers"] = kproxy_edit_brokers(full["brokers"])
    assert encode_body(METADATA, version, RESP, full) == spliced, "splice differs from decode+encode"
    assert kio_encode(version, kio_edit_brokers(kio_decode(version, data))) == spliced, "kio rewrite differs"
    scan = scan_body(METADATA, version, RESP, data)
    assert sum(1 for e in scan.entries if e[1] is not None) == partitions, "scan missed partitions"


# -- (a) headers ----------------------------------------------------------------------------
def header_rows(repeats: int, min_time: float) -> list[list[str]]:
    rows = []
    client_id = "console-producer-1"
    for hv, api_key, api_version, kio_type in ((1, 0, 7, KioHeaderV1), (2, 0, 9, KioHeaderV2)):
        raw = encode_request_header(RequestHeader(api_key, api_version, 12345, client_id, hv, {}))
        frame = raw + b"\x00" * 64  # a body follows the header in a real frame
        ours = decode_request_header(frame)
        kio_reader = entity_reader(kio_type)
        theirs, size = kio_reader(frame, 0)
        assert (ours.api_key, ours.api_version, ours.correlation_id, ours.client_id, ours.size) == \
            (theirs.request_api_key, theirs.request_api_version, theirs.correlation_id, theirs.client_id, size)
        assert peek_request(frame) == (api_key, api_version, 12345)
        t = side_by_side([
            ("decode", lambda f=frame: decode_request_header(f)),
            ("decode_hv", lambda f=frame, v=hv: decode_request_header(f, v)),
            ("peek", lambda f=frame: peek_request(f)),
            ("kio", lambda f=frame, r=kio_reader: r(f, 0)),
        ], repeats=repeats, min_time=min_time)
        what = f"header v{hv} (Produce v{api_version}, client id {len(client_id)} chars)"
        rows.append([f"`decode_request_header` {what}", fmt_rate(1 / t["decode"]), fmt_rate(1 / t["kio"]),
                     f"{t['kio'] / t['decode']:.2f}x", f">= {HEADER_TARGET:,}",
                     verdict(1 / t["decode"] >= HEADER_TARGET)])
        rows.append([f"`decode_request_header(frame, {hv})` (version given) {what}", fmt_rate(1 / t["decode_hv"]),
                     fmt_rate(1 / t["kio"]), f"{t['kio'] / t['decode_hv']:.2f}x", f">= {HEADER_TARGET:,}",
                     verdict(1 / t["decode_hv"] >= HEADER_TARGET)])
        rows.append([f"`peek_request` {what}", fmt_rate(1 / t["peek"]), "-", "-", "-", "-"])
    return rows


# -- (b)-(d) Metadata --------------------------------------------------------------------------
def metadata_rows(version: int, partitions: int, repeats: int,
                  min_time: float) -> tuple[list[list[str]], dict[str, float]]:
    data = encode_body(METADATA, version, RESP, metadata_body(version, partitions))
    verify(version, partitions, data)
    ours_decoded = decode_body(METADATA, version, RESP, data)
    kio_decoded = kio_decode(version, data)
    kio_writer = entity_writer(KIO_TYPES[version])
    kio_reader = entity_reader(KIO_TYPES[version])

    def kio_enc() -> bytes:
        buf = io.BytesIO()
        kio_writer(buf, kio_decoded)
        return buf.getvalue()

    def kproxy_splice() -> Any:
        return splice_body(METADATA, version, RESP, data, {"brokers": kproxy_edit_brokers})

    def kproxy_full_rewrite() -> bytes:
        body = decode_body(METADATA, version, RESP, data)
        body["brokers"] = kproxy_edit_brokers(body["brokers"])
        return encode_body(METADATA, version, RESP, body)

    def kio_rewrite() -> bytes:
        buf = io.BytesIO()
        kio_writer(buf, kio_edit_brokers(kio_reader(data, 0)[0]))
        return buf.getvalue()

    min_time = min_time if partitions <= 1000 else 0.0  # big inputs: one call per timed loop
    dec = side_by_side([("kproxy", lambda: decode_body(METADATA, version, RESP, data)),
                        ("kio", lambda: kio_reader(data, 0))], repeats=repeats, min_time=min_time)
    enc = side_by_side([("kproxy", lambda: encode_body(METADATA, version, RESP, ours_decoded)),
                        ("kio", kio_enc)], repeats=repeats, min_time=min_time)
    rew = side_by_side([("splice", kproxy_splice), ("full", kproxy_full_rewrite), ("kio", kio_rewrite)],
                       repeats=repeats, min_time=min_time)
    scan = side_by_side([("scan", lambda: scan_body(METADATA, version, RESP, data)),
                         ("kio", lambda: kio_reader(data, 0))], repeats=repeats, min_time=min_time)
    label = [f"v{version}", f"{partitions:,}", f"{len(data):,}"]
    splice_target = SPLICE_TARGET[partitions]
    rows = [
        [*label, "full decode", fmt_ms(dec["kproxy"]), fmt_ms(dec["kio"]), f"{dec['kio'] / dec['kproxy']:.2f}x",
         "-", "-"],
        [*label, "full encode", fmt_ms(enc["kproxy"]), fmt_ms(enc["kio"]), f"{enc['kio'] / enc['kproxy']:.2f}x",
         "-", "-"],
        [*label, "rewrite brokers: `splice_body` vs kio decode+edit+encode", fmt_ms(rew["splice"]),
         fmt_ms(rew["kio"]), f"{rew['kio'] / rew['splice']:.0f}x", f"<= {fmt_ms(splice_target)} ms",
         verdict(rew["splice"] <= splice_target)],
        [*label, "rewrite brokers: kproxy full decode+edit+encode vs kio", fmt_ms(rew["full"]), fmt_ms(rew["kio"]),
         f"{rew['kio'] / rew['full']:.2f}x", "-", "-"],
        [*label, "`scan_body` (partial decode) vs kio full decode", fmt_ms(scan["scan"]), fmt_ms(scan["kio"]),
         f"{scan['kio'] / scan['scan']:.2f}x", "-", "-"],
    ]
    return rows, {"splice": rew["splice"]}


# -- (e) per-frame pieces of the proxy's hot path --------------------------------------------------
def response_frame(api_key: int, api_version: int, body: dict[str, Any]) -> tuple[bytes, int]:
    """A response frame (size prefix included) and where its body starts."""
    payload = encode_response(7, api_key, api_version, body)
    header_size = len(encode_response(7, api_key, api_version, default_body(api_key, api_version, RESP))) - len(
        encode_body(api_key, api_version, RESP, default_body(api_key, api_version, RESP)))
    return len(payload).to_bytes(4, "big") + payload, 4 + header_size


def hot_path_rows(repeats: int, min_time: float) -> list[list[str]]:
    """Per-frame costs of what kproxy does to every response of a kind (in-process, one core)."""
    keys = [k for k in all_api_keys() if supported_versions(k) is not None]
    api_versions = {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
        {"api_key": k, "min_version": supported_versions(k)[0], "max_version": supported_versions(k)[1]}  # type: ignore[index]
        for k in keys]}
    av_frame, av_at = response_frame(18, 3, api_versions)
    md = default_body(METADATA, 1, RESP)
    md["brokers"] = [{"node_id": 1, "host": "127.0.0.1", "port": 9092, "rack": None}]
    md["controller_id"] = 1
    md["topics"] = [{"error_code": 0, "name": f"topic-{i}", "is_internal": False, "partitions": [
        {"error_code": 0, "partition_index": 0, "leader_id": 1, "replica_nodes": [1], "isr_nodes": [1]}]}
        for i in range(2)]
    md_frame, md_at = response_frame(METADATA, 1, md)
    rewriter = ResponseRewriter(AddressMap("127.0.0.1", 30000))
    assert rewriter.rewrite(18, 3, av_frame, av_at) is not None
    assert rewriter.rewrite(METADATA, 1, md_frame, md_at) is not None
    big = (5_000_000).to_bytes(4, "big") + bytes(5_000_000)
    chunks = [big[i:i + 256 * 1024] for i in range(0, len(big), 256 * 1024)]

    def split_big() -> None:
        splitter = FrameSplitter()
        got = []
        for chunk in chunks:
            if hasattr(splitter, "split"):  # the proxy's entry point where it exists
                got.extend(splitter.split(chunk)[0])
            else:
                splitter.feed(chunk)
                got.extend(splitter.raw_frames())
        assert len(got) == 1

    t = side_by_side([
        ("av_rewrite", lambda: rewriter.rewrite(18, 3, av_frame, av_at)),
        ("av_scan", lambda: scan_body(18, 3, RESP, av_frame, av_at)),
        ("md_rewrite", lambda: rewriter.rewrite(METADATA, 1, md_frame, md_at)),
        ("md_scan", lambda: scan_body(METADATA, 1, RESP, md_frame, md_at)),
        ("split_big", split_big),
        ("join_big", lambda: b"".join(chunks)),
    ], repeats=repeats, min_time=min_time)
    us = lambda x: f"{x * 1e6:,.1f}"  # noqa: E731
    return [
        [f"ApiVersions v3 response (all {len(keys)} api keys kproxy knows): "
         "`ResponseRewriter.rewrite` (version capping)",
         us(t["av_rewrite"]), "runs on every ApiVersions response"],
        ["ApiVersions v3 response: `scan_body` (error codes for metrics)", us(t["av_scan"]), ""],
        ["Metadata v1 response (1 broker, 2 topics): `ResponseRewriter.rewrite` (splice of brokers)",
         us(t["md_rewrite"]), ""],
        ["Metadata v1 response: `scan_body`", us(t["md_scan"]), ""],
        ["`FrameSplitter`: one 5 MB frame arriving in 256 KB chunks", us(t["split_big"]),
         f"floor: `b''.join` of the same chunks {us(t['join_big'])} µs"],
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, help="rounds per comparison; medians are reported (default 7; "
                        "with --quick 3)")
    parser.add_argument("--quick", action="store_true", help="1,000 partitions only, 3 repeats unless --repeats")
    parser.add_argument("--loop-seconds", type=float, default=0.05,
                        help="each timed loop repeats its call for at least this long (default 0.05; 0: one call, "
                             "for a smoke run)")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    sizes = (1_000,) if args.quick else (1_000, 100_000)

    print(f"### Codec benchmark ({machine_line()})\n")
    print(f"Median of {repeats} side-by-side rounds; kproxy and kio timed in turn on the same bytes. "
          "'kio/kproxy' > 1 means kproxy is faster.\n")
    print("#### (a) Request header decode, one core\n")
    print(table(["operation", "kproxy frames/s", "kio frames/s", "kio/kproxy", "target", "status"],
                header_rows(repeats, args.loop_seconds)))
    print()
    print("#### (e) Per-frame pieces of the proxy's hot path\n")
    print(table(["operation", "µs per frame", "note"], hot_path_rows(repeats, args.loop_seconds)))
    print()
    print("#### (b)-(d) Metadata response: decode, encode, broker rewrite, scan\n")
    print(f"{BROKERS} brokers, topics of {PARTITIONS_PER_TOPIC} partitions, replicas and ISR [0, 1, 2]. "
          "Times in ms per body.\n")
    rows: list[list[str]] = []
    for partitions in sizes:
        for version in (12, 1):
            more, _ = metadata_rows(version, partitions, repeats if partitions <= 1000 else max(3, repeats // 2),
                                    args.loop_seconds)
            rows.extend(more)
            print(f"  done: v{version} {partitions:,} partitions", file=sys.stderr)
    print(table(["version", "partitions", "body bytes", "operation", "kproxy ms", "kio ms", "kio/kproxy",
                 "target", "status"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
