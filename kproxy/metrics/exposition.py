"""Prometheus exposition of :class:`~kproxy.metrics.stats.TrafficStats`, and the HTTP endpoint.

One registry of kproxy's own (no default process collectors mixed in unless
asked): a custom collector turns the plain counters into metric families at
scrape time. Names follow Prometheus conventions: ``kproxy_`` prefix, base
units (seconds, bytes), ``_total`` for counters.

The endpoint (:class:`MetricsServer`) serves through kproxy/http_server.py:
``/metrics`` (text exposition), ``/healthz`` (the process answers: 200),
``/readyz`` (200 only while the listeners are up and the upstream is reachable;
503 with the reason otherwise).
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

import kproxy
from kproxy.http_server import HttpLimits, HttpServer, Request, Response
from kproxy.metrics.clusters import ClustersCollector
from kproxy.metrics.stats import BrokerSeries, TrafficStats
from kproxy.offloop import off_loop_build
from kproxy.protocol.codes import error_class, error_code

log = logging.getLogger("kproxy.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class LiveGauges:
    """Values read from the running server at scrape time."""

    in_flight: int = 0
    listeners: int = 0
    capture: Mapping[str, int] | None = None  # records by outcome; None: capture is off
    capture_over_budget: int = 0  # frames the capture read no further (kproxy.protocol.records.budget)
    # (side, subject) -> (not_before, not_after) of the TLS certificates in force (kproxy/server/tls_reload.py)
    certificates: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


class TrafficCollector(Collector):
    """Turns :class:`TrafficStats` into Prometheus metric families at scrape time."""

    def __init__(self, stats: TrafficStats, gauges: Callable[[], LiveGauges]) -> None:
        self.stats = stats
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield _info()
        brokers = list(s.brokers.values())
        yield _counter("kproxy_requests", "Requests read from clients, by the broker behind the connection "
                       "(node_id; bootstrap: the bootstrap port).", ["api", "version", "node_id"],
                       _by_node(brokers, lambda b: b.requests))
        yield _counter("kproxy_responses", "Responses written to clients.", ["api", "version", "node_id"],
                       _by_node(brokers, lambda b: b.responses))
        family = HistogramMetricFamily("kproxy_broker_latency_seconds", "Time from a request forwarded upstream to "
                                       "its response read back (the broker's time).", labels=["api", "node_id"])
        for broker in brokers:
            for api, hist in list(broker.broker_latency.items()):
                family.add_metric([api, broker.node_id], hist.cumulative(), hist.sum)
        yield family
        family = HistogramMetricFamily("kproxy_overhead_seconds", "kproxy's own time per request: reading, "
                                       "decoding, rewriting and writing, both ways.", labels=["api"])
        for api, hist in list(s.overhead.items()):
            family.add_metric([api], hist.cumulative(), hist.sum)
        yield family
        family = HistogramMetricFamily("kproxy_event_loop_lag_seconds", "How late kproxy's event loop ran a task "
                                       "that was due, sampled every 50 ms: every connection waits this long. Over "
                                       "0.1 s, one event=event_loop_blocked log line names what held it.")
        family.add_metric([], s.event_loop_lag.cumulative(), s.event_loop_lag.sum)
        yield family
        family = HistogramMetricFamily("kproxy_event_loop_held_seconds", "The event loop's lag less the time its "
                                       "thread waited for a CPU (Linux; the lag elsewhere): how long kproxy's own "
                                       "work held the loop. Lag without hold is a CPU-starved process.")
        family.add_metric([], s.event_loop_held.cumulative(), s.event_loop_held.sum)
        yield family
        yield _counter("kproxy_response_errors", "Kafka error codes (not NONE) found in responses, per partition "
                       "where the response has partitions; class: routine (normal protocol flow), retriable, "
                       "error.", ["api", "error", "class", "node_id"],
                       {(api, name, _class_of(name), b.node_id): n
                        for b in brokers for (api, name), n in list(b.errors.items())})
        yield _counter("kproxy_responses_with_errors", "Responses carrying at least one error code, by the worst "
                       "class among them (routine < retriable < error).", ["api", "class", "node_id"],
                       _by_node(brokers, lambda b: b.responses_with_errors))
        if s.options.topic_label:
            yield _counter("kproxy_topic_response_errors", "Kafka error codes in responses by topic "
                           "(opt-in; capped, the rest is 'other').", ["api", "topic", "error"], s.topic_errors)
        if s.options.client_id_label:
            yield _counter("kproxy_client_requests", "Requests by client id (opt-in; capped, the rest is "
                           "'other').", ["client_id", "api"], s.client_requests)
        if s.anomalies is not None:
            yield _counter("kproxy_client_anomalies", "Client bugs and misconfigurations seen on the wire, by kind "
                           "(stale_generation, producer_fenced, producer_sequence: answers' error codes; "
                           "connection_churn: connections closed per minute over the threshold; retry_storm: "
                           "batches sent again per minute over the threshold; rebalance_storm, "
                           "vanished_member: consumer groups' JoinGroups and members; deprecated_version, "
                           "acks0_producer, uncompressed_producer: once per connection) and client id (capped; the "
                           "rest is 'other').", ["kind", "client_id"], s.anomalies.series())
        yield _counter("kproxy_bytes", "Bytes of Kafka frames by api and direction (request: client to "
                       "broker; response: broker to client).", ["api", "direction"], s.byte_counts)
        yield _counter("kproxy_records", "Records in Produce requests and Fetch responses.", ["api"], s.records)
        yield from s.labelled.families()  # by topic and client, producers, client software (opt-in labels)
        yield _counter("kproxy_records_uncounted", "Produce requests and Fetch responses whose records were not "
                       "counted: unreadable, or legacy compressed records beyond the per-frame decompression "
                       "budget.", ["api"], s.records_uncounted)
        yield _counter("kproxy_undecodable_responses", "Responses whose body kproxy could not scan.", ["api"],
                       s.undecodable_responses)
        yield _gauge("kproxy_client_connections_active", "Open client connections, by listener and the broker "
                     "behind it (node_id).", ["listener", "node_id"], s.client_connections)
        yield _counter("kproxy_client_connections_accepted", "Client connections accepted.", ["listener", "node_id"],
                       s.client_connections_total)
        yield _counter("kproxy_client_connections_refused", "Client connections closed as soon as accepted "
                       "because limits.max_connections were open.", ["listener", "node_id"],
                       s.client_connections_refused)
        yield _counter("kproxy_accept_errors", "accept() failures for lack of descriptors or kernel memory "
                       "(the listener backs off and retries).", ["error"], s.accept_errors)
        yield _gauge("kproxy_upstream_connections_active", "Open upstream broker connections, by address and "
                     "node_id.", ["upstream", "node_id"], s.upstream_connections)
        yield _counter("kproxy_upstream_connect_failures", "Failed upstream connection attempts, by address and "
                       "node_id.", ["upstream", "node_id"], s.upstream_connect_failures)
        yield _gauge("kproxy_upstream_up", "1 when the last periodic check reached the upstream (a configured "
                     "bootstrap server, node_id=bootstrap, or a broker by node id), else 0.", ["upstream", "node_id"],
                     s.upstream_up)
        yield _counter("kproxy_frames_rejected", "Frames refused (the connection is closed).", ["reason"],
                       s.frames_rejected)
        yield _counter("kproxy_sasl_authentications", "SASL logins ended, re-authentications (KIP-368) included: "
                       "side=upstream, kproxy's own to the brokers (sasl.upstream); side=client, clients' to kproxy. "
                       "result: success, failure (refused: wrong credentials, mechanism not offered) or error (an "
                       "answer that could not be accepted, or none in time).", ["side", "mechanism", "result"],
                       s.sasl_authentications)
        yield _counter("kproxy_sasl_reauthentications", "Of kproxy_sasl_authentications_total, the "
                       "re-authentications (KIP-368) of connections already logged in.",
                       ["side", "mechanism", "result"], s.sasl_reauthentications)
        f = s.faults
        yield GaugeMetricFamily("kproxy_rules_loaded", "Enabled fault-injection rules loaded (--rules).",
                                value=f.rules_loaded)
        yield GaugeMetricFamily("kproxy_rules_generation", "Rule sets put in force since start (1: the one loaded "
                                "at start; each reload or admin change adds one).", value=f.rules_generation)
        yield _counter("kproxy_rules_reloads", "Reloads of the rules file or directory (on change, on SIGHUP), by "
                       "result; after a failure the previous rules stay in force.", ["result"], f.reloads)
        yield _counter("kproxy_rule_hits", "Fault-injection rule actions done (dry_run=\"true\": matched and logged "
                       "only). A rule's series go when it is no longer loaded; if it comes back it restarts from 0 "
                       "(a counter reset to rate()).", ["rule", "action", "dry_run"], f.hits)
        yield _counter("kproxy_injected_errors", "Kafka error codes injected by rules, by api and error.",
                       ["api", "error"], f.injected_errors)
        yield _counter("kproxy_rule_throttle_seconds", "Time responses were held by throttle rules (also reported "
                       "to clients as throttle_time_ms).", ["rule"], f.throttle_seconds)
        family = HistogramMetricFamily("kproxy_rule_held_seconds", "Time responses were held back by rules "
                                       "(delay, throttle), their own hold or one ahead of them on the connection: "
                                       "the rules' time, not counted in kproxy_overhead_seconds.",
                                       labels=["rule", "action"])
        for (rule, action), hist in list(f.held.items()):
            family.add_metric([rule, action], hist.cumulative(), hist.sum)
        yield family
        yield _counter("kproxy_rule_connection_faults", "Responses dropped and connections closed, reset or "
                       "blackholed by rules (limit_data: connections cut).", ["rule", "action"], f.connection_faults)
        yield _counter("kproxy_rule_wire_bytes", "Bytes written through byte-level toxics (bandwidth, slicer, "
                       "limit_data, delay at: wire), by the rule and action that installed them and direction "
                       "(upstream: to the broker, downstream: to the client).", ["rule", "action", "direction"],
                       f.wire_bytes)
        live = self.gauges()
        yield GaugeMetricFamily("kproxy_in_flight_requests", "Requests awaiting a response.", value=live.in_flight)
        yield GaugeMetricFamily("kproxy_listeners", "Listening ports (bootstrap and brokers).", value=live.listeners)
        over_budget = {"rules": f.records_over_budget}
        if live.capture is not None:
            yield _counter("kproxy_capture_records", "Capture records written to disk, or dropped (the writer's "
                           "queue was full, or a write failed), or abandoned (written, then their file could not "
                           "be completed).", ["outcome"], live.capture)
            over_budget["capture"] = live.capture_over_budget
        yield _gauge("kproxy_tls_certificate_expiry_timestamp_seconds", "When each TLS certificate kproxy "
                     "uses expires (notAfter, Unix seconds), by side (listener: the files it serves clients with, "
                     "tls.client; upstream: those it connects to brokers with, tls.upstream) and subject (RFC 4514); "
                     "follows the files as they are rotated. Of two with one subject on a side, the one that "
                     "expires first.", ["side", "subject"],
                     {key: after for key, (_, after) in live.certificates.items()})
        yield _gauge("kproxy_tls_certificate_not_before_timestamp_seconds", "When each TLS certificate of "
                     "kproxy_tls_certificate_expiry_timestamp_seconds became valid (notBefore, Unix seconds): with "
                     "it, the share of its lifetime left.", ["side", "subject"],
                     {key: before for key, (before, _) in live.certificates.items()})
        yield _counter("kproxy_records_over_budget", "Frames whose records a reader gave up on: reading them "
                       "needed more than the per-frame budget (a decompression bomb, say); the frame went on "
                       "unchanged. The metrics' own count: kproxy_records_uncounted.", ["reader"], over_budget)


def _class_of(error_name: str) -> str:
    code = error_code(error_name)
    # UNKNOWN_ERROR_CODE_<n>: a code this build does not know is an error
    return "error" if code is None else error_class(code)


def _info() -> Metric:
    family = GaugeMetricFamily("kproxy_build_info", "kproxy build information (always 1).",
                               labels=["version", "python"])
    family.add_metric([kproxy.__version__, platform.python_version()], 1)
    return family


Samples = Mapping[Any, float]


def _label_values(key: Any) -> list[str]:
    """Counter keys are a label value or a tuple of them (ints become strings)."""
    return [str(v) for v in key] if isinstance(key, tuple) else [str(key)]


def _counter(name: str, doc: str, labels: list[str], samples: Samples) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, n in list(samples.items()):
        family.add_metric(_label_values(key), n)
    return family


def _gauge(name: str, doc: str, labels: list[str], samples: Samples) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, n in list(samples.items()):
        family.add_metric(_label_values(key), n)
    return family


def _by_node(brokers: list[BrokerSeries], counts: Callable[[BrokerSeries], Mapping[Any, int]]
             ) -> dict[tuple[Any, ...], int]:
    """One broker-scoped counter of every broker, its keys extended with the ``node_id`` label."""
    return {(*key, b.node_id): n for b in brokers for key, n in list(counts(b).items())}


@dataclass(frozen=True)
class ClusterSeries:
    """What one cluster's series are made of, when kproxy serves several (``make_registry``'s ``clusters``)."""

    name: str
    stats: TrafficStats
    gauges: Callable[[], LiveGauges]
    lag: Collector | None = None


def make_registry(stats: TrafficStats, gauges: Callable[[], LiveGauges], *,
                  process: bool = False, lag: Collector | None = None,
                  clusters: Sequence[ClusterSeries] = ()) -> CollectorRegistry:
    """kproxy's own registry; ``process`` adds prometheus-client's standard process (CPU, memory, open
    fds, start time: ``process_*``), Python (``python_info``) and garbage-collector (``python_gc_*``)
    collectors, off by default (metrics.process_metrics); ``lag``, consumer lag's
    (:class:`kproxy.metrics.lag_exposition.ConsumerLagCollector`), when it is tracked. With
    ``clusters`` (several served: the first is ``stats``, ``gauges`` and ``lag``'s), every cluster's
    series, with a ``cluster`` label (:mod:`kproxy.metrics.clusters`)."""
    registry = CollectorRegistry(auto_describe=False)
    if clusters:
        registry.register(ClustersCollector([
            (c.name, [TrafficCollector(c.stats, c.gauges), *([c.lag] if c.lag is not None else [])])
            for c in clusters]))
    else:
        registry.register(TrafficCollector(stats, gauges))
        if lag is not None:
            registry.register(lag)
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


Readiness = Callable[[], Awaitable[str | None]]
TEXT = "text/plain; charset=utf-8"


def _render(registry: CollectorRegistry) -> bytes:
    with off_loop_build():  # no collection walks the families being made meanwhile
        return generate_latest(registry)


class MetricsServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` on one address, through kproxy's HTTP server
    (kproxy/http_server.py: connection cap, deadlines, no body worth reading).

    ``ready()`` returns None when ready, else the reason it is not.
    """

    def __init__(self, registry: CollectorRegistry, ready: Readiness, *, max_connections: int = 64) -> None:
        self.registry = registry
        self.ready = ready
        self.http = HttpServer("metrics", self, HttpLimits(max_connections=max_connections), log=log)

    @property
    def port(self) -> int:
        return self.http.port

    async def serve(self, host: str, port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        await self.http.serve(host, port, task_status=task_status)

    def check(self, request: Request) -> Response | None:
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers=(("allow", "GET, HEAD"),))
        return None

    def error(self, status: int, reason: str) -> Response:
        return Response(status, f"{reason}\n".encode())

    async def respond(self, request: Request) -> Response:
        target = request.target.split("?", 1)[0]
        if target == "/metrics":
            # Rendered in a worker thread: rendering grows with the series (a hit series per rule),
            # and on the loop it would hold every connection. The collector reads every counter
            # through a list() copy, which the GIL makes atomic against the loop's updates.
            return Response(200, await trio.to_thread.run_sync(_render, self.registry), CONTENT_TYPE)
        if target == "/healthz":
            return Response(200, b"ok\n")
        if target == "/readyz":
            reason = await self.ready()
            if reason is None:
                return Response(200, b"ready\n")
            return Response(503, f"not ready: {reason}\n".encode())
        return Response(404, b"not found: try /metrics, /healthz or /readyz\n")
