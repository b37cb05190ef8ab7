"""Prometheus exposition of :class:`~kproxy.metrics.stats.TrafficStats`, and the HTTP endpoint.

One registry of kproxy's own (no default process collectors mixed in unless
asked): a custom collector turns the plain counters into metric families at
scrape time. Names follow Prometheus conventions: ``kproxy_`` prefix, base
units (seconds, bytes), ``_total`` for counters.

The endpoint is a small HTTP/1.1 server on trio with h11 doing the parsing:
``/metrics`` (text exposition), ``/healthz`` (the process answers: 200),
``/readyz`` (200 only while the listeners are up and the upstream is reachable;
503 with the reason otherwise).
"""

from __future__ import annotations

import errno
import logging
import platform
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import h11
import trio
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

import kproxy
from kproxy.metrics.stats import ACCEPT_CAPACITY_ERRORS, BrokerSeries, TrafficStats
from kproxy.protocol.tables import error_class, error_code

log = logging.getLogger("kproxy.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class LiveGauges:
    """Values read from the running server at scrape time."""

    in_flight: int = 0
    listeners: int = 0
    capture: Mapping[str, int] | None = None  # records by outcome; None: capture is off
    capture_over_budget: int = 0  # frames the capture read no further (kproxy.protocol.records.budget)


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
        yield _counter("kproxy_bytes", "Bytes of Kafka frames by api and direction (request: client to "
                       "broker; response: broker to client).", ["api", "direction"], s.byte_counts)
        yield _counter("kproxy_records", "Records in Produce requests and Fetch responses.", ["api"], s.records)
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
        f = s.faults
        yield GaugeMetricFamily("kproxy_rules_loaded", "Enabled fault-injection rules loaded (--rules).",
                                value=f.rules_loaded)
        yield GaugeMetricFamily("kproxy_rules_generation", "Rule sets put in force since start (1: the one loaded "
                                "at start; each reload or admin change adds one).", value=f.rules_generation)
        yield _counter("kproxy_rules_reloads", "Reloads of the rules file or directory (on change, on SIGHUP), by "
                       "result; after a failure the previous rules stay in force.", ["result"], f.reloads)
        yield _counter("kproxy_rule_hits", "Fault-injection rule actions done (dry_run=\"true\": matched and logged "
                       "only).", ["rule", "action", "dry_run"], f.hits)
        yield _counter("kproxy_injected_errors", "Kafka error codes injected by rules, by api and error.",
                       ["api", "error"], f.injected_errors)
        yield _counter("kproxy_rule_throttle_seconds", "Time responses were held by throttle rules (also reported "
                       "to clients as throttle_time_ms).", ["rule"], f.throttle_seconds)
        yield _counter("kproxy_rule_connection_faults", "Responses dropped and connections closed, reset or "
                       "blackholed by rules.", ["rule", "action"], f.connection_faults)
        live = self.gauges()
        yield GaugeMetricFamily("kproxy_in_flight_requests", "Requests awaiting a response.", value=live.in_flight)
        yield GaugeMetricFamily("kproxy_listeners", "Listening ports (bootstrap and brokers).", value=live.listeners)
        over_budget = {"rules": f.records_over_budget}
        if live.capture is not None:
            yield _counter("kproxy_capture_records", "Capture records written to disk, or dropped (the writer's "
                           "queue was full, or a write failed), or abandoned (written, then their file could not "
                           "be completed).", ["outcome"], live.capture)
            over_budget["capture"] = live.capture_over_budget
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


def make_registry(stats: TrafficStats, gauges: Callable[[], LiveGauges], *,
                  process: bool = False) -> CollectorRegistry:
    """kproxy's own registry; ``process`` adds prometheus-client's standard process (CPU, memory, open
    fds, start time: ``process_*``), Python (``python_info``) and garbage-collector (``python_gc_*``)
    collectors, off by default (metrics.process_metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TrafficCollector(stats, gauges))
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


Readiness = Callable[[], Awaitable[str | None]]


async def accept_connections(listener: trio.SocketListener, nursery: trio.Nursery,
                             handle: Callable[[trio.SocketStream], Awaitable[None]], *, name: str) -> None:
    """trio.serve_listeners for kproxy's HTTP listeners (metrics, admin), but out of descriptors it
    logs one logfmt line per 10 s naming the listener (trio's own logs a traceback per failed
    accept, through the root logger) and keeps accepting."""
    next_warning = 0.0
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                error = errno.errorcode.get(exc.errno or 0, "")
                if error not in ACCEPT_CAPACITY_ERRORS:
                    raise
                if time.monotonic() >= next_warning:
                    next_warning = time.monotonic() + 10
                    log.warning("event=accept_failed listener=%s error=%s retry_in_s=0.1", name, error)
                await trio.sleep(0.1)
                continue
            nursery.start_soon(handle, stream)


class MetricsServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` on one address.

    ``ready()`` returns None when ready, else the reason it is not.
    """

    def __init__(self, registry: CollectorRegistry, ready: Readiness) -> None:
        self.registry = registry
        self.ready = ready
        self.port = 0

    async def serve(self, host: str, port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("event=metrics_listening address=%s:%d", host, self.port)
        task_status.started()
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, nursery)

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        await accept_connections(listener, nursery, self._handle, name="metrics")

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(10):
                await self._exchange(stream)
        except (trio.BrokenResourceError, h11.RemoteProtocolError, OSError):
            pass  # a broken scrape connection is the scraper's problem
        finally:
            await trio.aclose_forcefully(stream)

    async def _exchange(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                if not data:
                    return
                continue
            if isinstance(event, h11.Request):
                break
            if isinstance(event, h11.ConnectionClosed):
                return
        target = event.target.decode("latin-1").split("?", 1)[0]
        status, body, ctype = await self._route(event.method.decode("latin-1"), target)
        headers = [("content-type", ctype), ("content-length", str(len(body))), ("connection", "close")]
        await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
        if event.method != b"HEAD":
            await stream.send_all(conn.send(h11.Data(data=body)) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")

    async def _route(self, method: str, target: str) -> tuple[int, bytes, str]:
        if method not in ("GET", "HEAD"):
            return 405, b"method not allowed\n", "text/plain"
        if target == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE
        if target == "/healthz":
            return 200, b"ok\n", "text/plain"
        if target == "/readyz":
            reason = await self.ready()
            if reason is None:
                return 200, b"ready\n", "text/plain"
            return 503, f"not ready: {reason}\n".encode(), "text/plain"
        return 404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain"
