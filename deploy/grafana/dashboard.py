"""Generates ``kproxy-dashboard.json``, the Grafana dashboard for kproxy's ``/metrics``.

The JSON is built with Grafana's own Python SDK (``grafana-foundation-sdk``, a
test dependency) and committed next to this file, so a Grafana can import it
without Python. Edit this file, never the JSON, then regenerate::

    .venv/bin/python deploy/grafana/dashboard.py          # rewrite the JSON
    .venv/bin/python deploy/grafana/dashboard.py --check  # exit 1 if the JSON is stale

The test suite runs the check, and evaluates every query below against a real
Prometheus scraping a real kproxy (tests/test_metrics_prometheus.py).

Template variables: ``datasource`` (any Prometheus), ``job``, ``namespace``, ``pod``
and ``instance`` (from ``kproxy_build_info``; namespace and pod are the target labels
the Kubernetes scrape configs and prometheus-operator add, "All" elsewhere), ``cluster`` (of a
kproxy serving several: docs/CLUSTERS.md; "All" matches a single cluster's series, which have no
such label), ``api``
(Kafka API names as kproxy labels them: ``produce``, ``fetch``, ``metadata`` ...),
``node_id`` (the broker behind a connection: its Kafka node id, or ``bootstrap``), which
filters the broker-scoped panels only (requests, latency, errors, connections), and the
traffic rows' ``topic`` (Topics, Consumer lag, Lag (seconds)), ``client_id`` (Clients, Producers)
and ``group`` (Consumer lag, Lag (seconds)).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement, StackingMode
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableModel,
    VariableRefresh,
    VariableSort,
)

OUTPUT = Path(__file__).with_name("kproxy-dashboard.json")
UID = "kproxy-overview"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Every selector carries the dashboard's filters; $api only where the metric has an api label.
# namespace=~".*" also matches series without the label (static scrape configs), so "All" works anywhere.
SEL = 'job=~"$job", namespace=~"$namespace", pod=~"$pod", instance=~"$instance"'
# A kproxy serving several clusters (docs/CLUSTERS.md) labels their series with cluster; the process's
# own (rules, event loop) have none, so they keep SEL. cluster=~".*" matches series without it too.
SEL_CLUSTER = SEL + ', cluster=~"$cluster"'
SEL_API = SEL_CLUSTER + ', api=~"$api"'
# Broker-scoped series (requests, responses, broker latency, error codes) also carry node_id; bytes,
# records and kproxy's own time do not, so they keep SEL_API (a node filter would empty them).
SEL_NODE = SEL_CLUSTER + ', node_id=~"$node_id"'
SEL_BROKER = SEL_API + ', node_id=~"$node_id"'
# The traffic rows' series (opt-in labels: metrics.topic_label, metrics.client_id_label; consumer lag).
SEL_TOPIC = SEL_CLUSTER + ', topic=~"$topic"'
SEL_CLIENT = SEL_CLUSTER + ', client_id=~"$client_id"'
SEL_GROUP = SEL + ', group=~"$group", topic=~"$topic"'
WINDOW = "$__rate_interval"
TOP = 10  # the traffic rows show the top 10 by rate
# Lag moves by commits, seconds apart: its slope is read over minutes, not over the rate interval.
LAG_WINDOW = "5m"
# APIs whose requests wait on purpose (KIP-227 / max.wait.ms long polls, group rebalances): their
# latency says how long the broker was asked to wait, not how fast it is, so it gets its own panel.
LONG_POLLS = "fetch|share_fetch|join_group|sync_group"


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)


def graph(title: str, description: str, unit: str, *queries: prometheus.Dataquery,
          width: int = 12, stacked: bool = False) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .height(8).span(width).fill_opacity(30 if stacked else 10).line_width(1).min(0)
             .stacking(StackingConfig().mode(StackingMode.NORMAL if stacked else StackingMode.NONE))
             .legend(VizLegendOptions().display_mode(LegendDisplayMode.TABLE).placement(LegendPlacement.BOTTOM)
                     .show_legend(True).calcs(["mean", "max", "lastNotNull"])))
    for q in queries:
        panel = panel.with_target(q)
    return panel


def single(title: str, description: str, unit: str, expr: str, legend: str,
           steps: list[tuple[float | None, str]]) -> stat.Panel:
    thresholds = dash.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=value, color=color) for value, color in steps])
    return (stat.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
            .height(4).span(6).thresholds(thresholds).with_target(query(expr, legend)))


def quantile(q: float, metric: str, ref: str, apis: str = "") -> prometheus.Dataquery:
    """p``q`` by API of a latency histogram; ``apis`` narrows the API selector (e.g. ``api!~"..."``)."""
    sel = (SEL_BROKER if metric == "kproxy_broker_latency_seconds" else SEL_API) + (f", {apis}" if apis else "")
    expr = (f"histogram_quantile({q}, sum by (api, le) "
            f"(rate({metric}_bucket{{{sel}}}[{WINDOW}])))")
    return query(expr, f"{{{{api}}}} p{round(q * 100)}", ref)


def overview_row() -> list[stat.Panel]:
    return [
        single("Instances up", "kproxy processes Prometheus scraped successfully (up == 1).", "none",
               f'sum(up{{{SEL}}})', "up", [(None, "red"), (1, "green")]),
        single("Requests / s", "All Kafka requests read from clients, all APIs.", "reqps",
               f"sum(rate(kproxy_requests_total{{{SEL_BROKER}}}[{WINDOW}]))", "requests/s", [(None, "blue")]),
        single("Failed responses", "Share of responses carrying a retriable or non-retriable Kafka error "
               "code (a response counts once, however many of its partitions failed). Routine codes of "
               "normal protocol flow (MEMBER_ID_REQUIRED, REBALANCE_IN_PROGRESS, fetch-session resets) "
               "are left out.", "percentunit",
               f'sum(rate(kproxy_responses_with_errors_total{{{SEL_BROKER}, class!="routine"}}[{WINDOW}])) / '
               f"sum(rate(kproxy_responses_total{{{SEL_BROKER}}}[{WINDOW}]))", "failed/responses",
               [(None, "green"), (0.01, "orange"), (0.05, "red")]),
        single("In flight", "Requests forwarded upstream and still awaiting their response.", "none",
               f"sum(kproxy_in_flight_requests{{{SEL}}})", "in flight", [(None, "green"), (500, "orange")]),
    ]


def traffic_row() -> list[timeseries.Panel]:
    return [
        graph("Request rate by API", "Requests read from clients, per second, by Kafka API.", "reqps",
              query(f"sum by (api) (rate(kproxy_requests_total{{{SEL_BROKER}}}[{WINDOW}]))", "{{api}}"),
              stacked=True),
        graph("Bytes by direction", "Kafka frame bytes per second: request = client to broker, "
              "response = broker to client.", "Bps",
              query(f"sum by (direction) (rate(kproxy_bytes_total{{{SEL_API}}}[{WINDOW}]))",
                    "{{direction}}")),
        graph("Records by API", "Records in Produce requests and in Fetch responses, per second "
              "(counted from batch headers, nothing decompressed for v2 batches).", "suffix: records/s",
              query(f"sum by (api) (rate(kproxy_records_total{{{SEL_API}}}[{WINDOW}]))", "{{api}}")),
        graph("Requests by API version", "Which protocol versions clients use, per second.", "reqps",
              query(f"sum by (api, version) (rate(kproxy_requests_total{{{SEL_BROKER}}}[{WINDOW}]))",
                    "{{api}} v{{version}}")),
    ]


def latency_row() -> list[timeseries.Panel]:
    return [
        graph("Broker latency p50 / p99", "From a request forwarded upstream to its response read back: "
              "the broker's time (and the network's), for every API that answers at once. Long polls "
              "are on the next panel.", "s",
              quantile(0.5, "kproxy_broker_latency_seconds", "A", f'api!~"{LONG_POLLS}"'),
              quantile(0.99, "kproxy_broker_latency_seconds", "B", f'api!~"{LONG_POLLS}"')),
        graph("Long polls p50 / p99", "Fetch, ShareFetch, JoinGroup and SyncGroup wait on purpose "
              "(fetch.max.wait.ms, rebalances): this is mostly the wait clients asked for, not broker "
              "slowness.", "s",
              quantile(0.5, "kproxy_broker_latency_seconds", "A", f'api=~"{LONG_POLLS}"'),
              quantile(0.99, "kproxy_broker_latency_seconds", "B", f'api=~"{LONG_POLLS}"')),
        graph("kproxy overhead p50 / p99", "kproxy's own time per request: reading, decoding, rewriting and "
              "writing, both directions. Microseconds when healthy. Time fault-injection rules hold "
              "responses (delay, throttle) is not in it: it is on the next panel.", "s",
              quantile(0.5, "kproxy_overhead_seconds", "A"),
              quantile(0.99, "kproxy_overhead_seconds", "B")),
        graph("Held by rules p50 / p99", "How long fault-injection rules (delay, throttle) held responses "
              "back, by rule and action: their own hold, or one ahead of them on the connection. The "
              "rules' time, kept out of kproxy's overhead; empty when no such rule is loaded.", "s",
              query(f"histogram_quantile(0.5, sum by (rule, action, le) "
                    f"(rate(kproxy_rule_held_seconds_bucket{{{SEL}}}[{WINDOW}])))", "{{rule}} {{action}} p50"),
              query(f"histogram_quantile(0.99, sum by (rule, action, le) "
                    f"(rate(kproxy_rule_held_seconds_bucket{{{SEL}}}[{WINDOW}])))", "{{rule}} {{action}} p99",
                    "B")),
    ]


def errors_row() -> list[timeseries.Panel]:
    return [
        graph("Error codes by API", "Kafka error codes (not NONE) found in responses, per second, by API "
              "and error name, per partition where the response has partitions. Class: routine (normal "
              "protocol flow), retriable (clients retry by themselves), error.", "cps",
              query(f"sum by (api, error, class) (rate(kproxy_response_errors_total{{{SEL_BROKER}}}[{WINDOW}]))",
                    "{{api}} {{error}} ({{class}})"), width=12, stacked=True),
        graph("Responses with errors by class", "Responses carrying at least one error code, per second, by "
              "the worst class among their codes: routine < retriable < error.", "reqps",
              query(f"sum by (class) (rate(kproxy_responses_with_errors_total{{{SEL_BROKER}}}[{WINDOW}]))",
                    "{{class}}"), width=12, stacked=True),
        graph("Frames rejected", "Frames kproxy refused (oversize, malformed header), by reason; each "
              "closes its connection.", "short",
              query(f"sum by (reason) (increase(kproxy_frames_rejected_total{{{SEL}}}[{WINDOW}]))",
                    "{{reason}}")),
        graph("Upstream connect failures", "Failed connection attempts to brokers, by address and node_id "
              "(bootstrap: a configured bootstrap server).", "short",
              query(f"sum by (upstream, node_id) (increase(kproxy_upstream_connect_failures_total{{{SEL_NODE}}}"
                    f"[{WINDOW}]))", "{{upstream}} (node {{node_id}})")),
    ]


def brokers_row() -> list[timeseries.Panel]:
    """The same traffic split by broker: one slow or failing broker stands out from the others."""
    return [
        graph("Requests by broker", "Requests per second by the broker behind the connection (node_id; "
              "bootstrap: the bootstrap port, mostly Metadata and ApiVersions).", "reqps",
              query(f"sum by (node_id) (rate(kproxy_requests_total{{{SEL_BROKER}}}[{WINDOW}]))",
                    "node {{node_id}}"), width=8, stacked=True),
        graph("Broker latency p99 by broker", "The broker's time per request (long polls left out, as on the "
              "Broker latency panel), p99 for each broker: the one that is slow.", "s",
              query(f"histogram_quantile(0.99, sum by (node_id, le) (rate(kproxy_broker_latency_seconds_bucket"
                    f'{{{SEL_BROKER}, api!~"{LONG_POLLS}"}}[{WINDOW}])))', "node {{node_id}} p99"), width=8),
        graph("Failed responses by broker", "Share of each broker's responses carrying a retriable or "
              "non-retriable error code (routine codes left out, as on the overview).", "percentunit",
              query(f'sum by (node_id) (rate(kproxy_responses_with_errors_total{{{SEL_BROKER}, class!="routine"}}'
                    f"[{WINDOW}])) / sum by (node_id) (rate(kproxy_responses_total{{{SEL_BROKER}}}[{WINDOW}]))",
                    "node {{node_id}}"), width=8),
    ]


def faults_row() -> list[timeseries.Panel]:
    return [
        graph("Rules in force", "Enabled fault-injection rules (kproxy run --rules), per instance: anything "
              "above 0 means kproxy is set to misbehave on purpose. Beside it the rule set's generation (one "
              "more at each reload or admin change) and the reloads of the rules file by result: after a "
              "failed one the previous rules stay in force.", "short",
              query(f"max by (instance) (kproxy_rules_loaded{{{SEL}}})", "{{instance}} rules"),
              query(f"max by (instance) (kproxy_rules_generation{{{SEL}}})", "{{instance}} generation", "B"),
              query(f"sum by (instance, result) (increase(kproxy_rules_reloads_total{{{SEL}}}[{WINDOW}]))",
                    "{{instance}} reloads ({{result}})", "C"), width=4),
        graph("Rule actions done", "Fault-injection actions carried out per second, by rule and action. "
              "Dry-run rules are on the next panel.", "ops",
              query(f'sum by (rule, action) (rate(kproxy_rule_hits_total{{{SEL}, dry_run="false"}}[{WINDOW}]))',
                    "{{rule}} {{action}}"), width=5, stacked=True),
        graph("Dry-run matches", "What dry-run (shadow) rules would have done, per second, by rule and action: "
              "matched, counted and logged (dry_run=true), nothing done to the traffic. Beside the actions "
              "done, to compare before a rule is switched on.", "ops",
              query(f'sum by (rule, action) (rate(kproxy_rule_hits_total{{{SEL}, dry_run="true"}}[{WINDOW}]))',
                    "{{rule}} {{action}} (dry run)"), width=5, stacked=True),
        graph("Injected errors", "Kafka error codes injected by rules per second, by API and error.", "cps",
              query(f"sum by (api, error) (rate(kproxy_injected_errors_total{{{SEL_API}}}[{WINDOW}]))",
                    "{{api}} {{error}}"), width=5, stacked=True),
        graph("Throttle and connection faults", "Seconds of throttle applied per second, by rule; responses "
              "dropped and connections closed, reset or blackholed, by rule and action.", "short",
              query(f"sum by (rule) (rate(kproxy_rule_throttle_seconds_total{{{SEL}}}[{WINDOW}]))",
                    "throttle {{rule}}"),
              query(f"sum by (rule, action) (increase(kproxy_rule_connection_faults_total{{{SEL}}}[{WINDOW}]))",
                    "{{action}} {{rule}}", "B"), width=5),
    ]


def connections_row() -> list[timeseries.Panel]:
    return [
        graph("Client connections", "Open client connections by the broker behind their listener "
              "(node_id; bootstrap: the bootstrap port).", "short",
              query(f"sum by (node_id) (kproxy_client_connections_active{{{SEL_NODE}}})", "node {{node_id}}"),
              width=8),
        graph("Upstream connections", "Open connections to brokers by node_id and address: the other end "
              "of the client connections beside.", "short",
              query(f"sum by (node_id, upstream) (kproxy_upstream_connections_active{{{SEL_NODE}}})",
                    "node {{node_id}} ({{upstream}})"), width=8),
        graph("Upstream reachable", "The periodic check of every bootstrap server and known broker "
              "(upstream_check_interval): 1 reachable, 0 not, the worst instance shown.", "none",
              query(f"min by (upstream, node_id) (kproxy_upstream_up{{{SEL_NODE}}})",
                    "{{upstream}} (node {{node_id}})"),
              width=8),
        graph("In-flight requests", "Requests awaiting a broker response, per kproxy instance.", "short",
              query(f"sum by (instance) (kproxy_in_flight_requests{{{SEL}}})", "{{instance}}"), width=8),
        graph("Event-loop lag", "How late kproxy's event loop ran a due task (sampled every 50 ms): every "
              "connection of the instance waits this long. Healthy is under a few ms; over 100 ms, the log "
              "line event=event_loop_blocked names what held the loop. Held is the lag less the loop thread's "
              "wait for a CPU: lag well above held is a CPU-starved pod, not kproxy's work.", "s",
              query("histogram_quantile(0.99, sum by (instance, le) "
                    f"(rate(kproxy_event_loop_lag_seconds_bucket{{{SEL}}}[{WINDOW}])))", "p99 {{instance}}"),
              query(f"max by (instance) (rate(kproxy_event_loop_lag_seconds_sum{{{SEL}}}[{WINDOW}]) / "
                    f"rate(kproxy_event_loop_lag_seconds_count{{{SEL}}}[{WINDOW}]))", "mean {{instance}}", "B"),
              query("histogram_quantile(0.99, sum by (instance, le) "
                    f"(rate(kproxy_event_loop_held_seconds_bucket{{{SEL}}}[{WINDOW}])))", "held p99 {{instance}}",
                    "C"),
              width=8),
        graph("TLS certificates: time left", "Time until each certificate of kproxy's TLS files expires "
              "(side listener: what it serves clients with and the CA of their certificates; upstream: "
              "the brokers' CA and its client certificate), the soonest instance's. A rotation makes it "
              "jump back up; a line heading for 0 is a rotation that did not happen (alert "
              "KproxyCertificateExpiresSoon). Empty without TLS.", "s",
              query(f"min by (side, subject) (kproxy_tls_certificate_expiry_timestamp_seconds{{{SEL}}}) - time()",
                    "{{side}} {{subject}}"),
              width=8),
    ]


def topics_row() -> list[timeseries.Panel]:
    """Traffic by topic (metrics.topic_label): what BrokerTopicMetrics gives per broker, from the wire."""
    def by_topic(direction: str) -> str:
        return (f"topk({TOP}, sum by (topic) (rate(kproxy_topic_bytes_total{{{SEL_TOPIC}, "
                f'direction="{direction}"}}[{WINDOW}])))')

    return [
        graph("Produced bytes by topic", f"Bytes of record batches clients sent in Produce requests, per "
              f"second, the {TOP} busiest topics (as the brokers' BytesInPerSec, without replication).", "Bps",
              query(by_topic("produce"), "{{topic}}"), width=6),
        graph("Fetched bytes by topic", f"Bytes of record batches clients received in Fetch responses, per "
              f"second, the {TOP} busiest topics (as the brokers' BytesOutPerSec to clients).", "Bps",
              query(by_topic("fetch"), "{{topic}}"), width=6),
        graph("Records by topic", f"Records per second in Produce requests and Fetch responses, the {TOP} "
              "busiest topic and direction pairs (counted from batch headers; as MessagesInPerSec for "
              "produce).", "suffix: records/s",
              query(f"topk({TOP}, sum by (topic, direction) (rate(kproxy_topic_records_total{{{SEL_TOPIC}}}"
                    f"[{WINDOW}])))", "{{topic}} {{direction}}"), width=6),
        graph("Fetch fan-out by topic", f"Bytes fetched over bytes produced, per topic (the {TOP} highest): "
              "about how many times each record is read (consumer groups, replays). Below 1: consumers "
              "fall behind or read elsewhere.", "none",
              query(f'topk({TOP}, sum by (topic) (rate(kproxy_topic_bytes_total{{{SEL_TOPIC}, direction="fetch"}}'
                    f"[{WINDOW}])) / sum by (topic) (rate(kproxy_topic_bytes_total{{{SEL_TOPIC}, "
                    f'direction="produce"}}[{WINDOW}])))', "{{topic}}"), width=6),
    ]


def clients_row() -> list[timeseries.Panel]:
    """Traffic by client id (metrics.client_id_label), and the client software connected."""
    return [
        graph("Bytes by client", f"Bytes of record batches per second each client id sent (produce) or "
              f"received (fetch), the {TOP} busiest (as the brokers' per-client quota metrics).", "Bps",
              query(f"topk({TOP}, sum by (client_id, direction) (rate(kproxy_client_bytes_total{{{SEL_CLIENT}}}"
                    f"[{WINDOW}])))", "{{client_id}} {{direction}}"), width=6),
        graph("Records by client", f"Records per second each client id sent or received, the {TOP} busiest.",
              "suffix: records/s",
              query(f"topk({TOP}, sum by (client_id, direction) (rate(kproxy_client_records_total{{{SEL_CLIENT}}}"
                    f"[{WINDOW}])))", "{{client_id}} {{direction}}"), width=6),
        graph("Client software", "Open connections by the client library and version they named in "
              "ApiVersions (KIP-511): librdkafka, apache-kafka-java, kafka-python... Old versions stand out.",
              "short",
              query(f"sum by (software_name, software_version) (kproxy_client_info{{{SEL_CLIENT}}})",
                    "{{software_name}} {{software_version}}"), width=6, stacked=True),
        graph("Connections by client", f"Open connections per client id, the {TOP} with the most (those that "
              "named their software in ApiVersions v3+).", "short",
              query(f"topk({TOP}, sum by (client_id) (kproxy_client_info{{{SEL_CLIENT}}}))", "{{client_id}}"),
              width=6),
    ]


def lag_row() -> list[timeseries.Panel]:
    """Consumer lag (metrics.consumer_lag), from the offsets groups commit and the watermarks Fetch answers carry."""
    return [
        graph("Lag by group and topic", f"Records each group has yet to consume per topic (high watermark less "
              f"committed offset, summed over partitions), the {TOP} largest. Only groups whose traffic crosses "
              "kproxy, while fresh (metrics.consumer_lag_stale_after).", "short",
              query(f"topk({TOP}, sum by (group, topic) (kproxy_consumergroup_lag_sum{{{SEL_GROUP}}}))",
                    "{{group}} {{topic}}"), width=8),
        graph("Lag growth", f"How fast each group's lag changes, records per minute over {LAG_WINDOW} (the "
              f"{TOP} fastest growing): above 0 for long, the group falls behind (KproxyConsumerLagGrowing).",
              "short",
              query(f"topk({TOP}, 60 * sum by (group, topic) (deriv(kproxy_consumergroup_lag_sum{{{SEL_GROUP}}}"
                    f"[{LAG_WINDOW}])))", "{{group}} {{topic}}"), width=8),
        graph("Consumed and produced", f"Records per second each group commits past (its committed offsets' "
              f"slope) beside the topic's growth (its high watermarks' slope), over {LAG_WINDOW}.",
              "suffix: records/s",
              query(f"sum by (group, topic) (deriv(kproxy_consumergroup_committed_offset{{{SEL_GROUP}}}"
                    f"[{LAG_WINDOW}]))", "{{group}} {{topic}} consumed"),
              query(f"sum by (topic) (deriv(kproxy_partition_high_watermark{{{SEL_TOPIC}}}[{LAG_WINDOW}]))",
                    "{{topic}} produced", "B"), width=8),
    ]


def lag_seconds_row() -> list[timeseries.Panel]:
    """Consumer lag in time (metrics.consumer_lag): how old the records a group has yet to read are,
    from the record batches' timestamps kproxy saw in Produce requests, and how long until it catches up."""
    return [
        graph("Lag in seconds", f"How long ago the oldest record each group has not committed on the topic was "
              f"written (the batches' CreateTime, as producers stamp it), the {TOP} largest: 0 when caught up.",
              "s",
              query(f"topk({TOP}, max by (group, topic) (kproxy_consumergroup_lag_seconds{{{SEL_GROUP}}}))",
                    "{{group}} {{topic}}"), width=8),
        graph("Lag seconds growth", f"How fast each group's lag in seconds grows, seconds per second over "
              f"{LAG_WINDOW} (the {TOP} fastest): 1, the group has stopped; between 0 and 1, it falls behind "
              "(KproxyConsumerLagSecondsGrowing).", "short",
              query(f"topk({TOP}, max by (group, topic) (deriv(kproxy_consumergroup_lag_seconds{{{SEL_GROUP}}}"
                    f"[{LAG_WINDOW}])))", "{{group}} {{topic}}"), width=8),
        graph("Time to catch up", f"At each group's recent rates (what it consumes less what producers write), how "
              f"long until it is caught up, the {TOP} longest: no line while it does not gain on the producers.",
              "s",
              query(f"topk({TOP}, max by (group, topic) (kproxy_consumergroup_catchup_seconds{{{SEL_GROUP}}}))",
                    "{{group}} {{topic}}"), width=8),
    ]


def producers_row() -> list[timeseries.Panel]:
    """Producer behaviour (metrics.client_id_label): compression, acks, batch sizes."""
    return [
        graph("Batches by compression", "Record batches per second in Produce requests, by compression codec.",
              "ops",
              query(f"sum by (compression) (rate(kproxy_produce_batches_total{{{SEL_CLIENT}}}[{WINDOW}]))",
                    "{{compression}}"), width=6, stacked=True),
        graph("Uncompressed producers", f"Uncompressed batches per second by client id, the {TOP} busiest: "
              "candidates for compression.type (KproxyUncompressedProduce, opt-in).", "ops",
              query(f'topk({TOP}, sum by (client_id) (rate(kproxy_produce_batches_total{{{SEL_CLIENT}, '
                    f'compression="none"}}[{WINDOW}])))', "{{client_id}}"), width=6),
        graph("Batches by acks", f"Batches per second by client id and the acks of their requests, the {TOP} "
              "busiest: acks=0 gets no answer (no error reaches the producer), 1 the leader's, -1 (all) the "
              "in-sync replicas'.", "ops",
              query(f"topk({TOP}, sum by (client_id, acks) (rate(kproxy_produce_batches_total{{{SEL_CLIENT}}}"
                    f"[{WINDOW}])))", "{{client_id}} acks={{acks}}"), width=6),
        graph("Batch size p50 / p99", "Size of the record batches in Produce requests by compression codec "
              "(compressed size on the wire): small batches mean little batching (linger.ms, batch.size).",
              "bytes",
              query(f"histogram_quantile(0.5, sum by (compression, le) (rate(kproxy_produce_batch_bytes_bucket"
                    f"{{{SEL}}}[{WINDOW}])))", "{{compression}} p50"),
              query(f"histogram_quantile(0.99, sum by (compression, le) (rate(kproxy_produce_batch_bytes_bucket"
                    f"{{{SEL}}}[{WINDOW}])))", "{{compression}} p99", "B"), width=6),
    ]


def anomalies_row() -> list[timeseries.Panel]:
    """Client bugs and misconfigurations kproxy read off the wire (metrics.client_anomalies)."""
    return [
        graph("Anomalies by kind", "Client anomalies kproxy saw in the last hour, by kind: stale_generation, "
              "producer_fenced, producer_sequence, connection_churn, retry_storm, rebalance_storm, vanished_member "
              "(KproxyClientErrors); deprecated_version, "
              "acks0_producer, uncompressed_producer (KproxyClientMisconfigured). The first of each client and "
              "kind is an event=client_anomaly log line.", "short",
              query(f"sum by (kind) (increase(kproxy_client_anomalies_total{{{SEL_CLIENT}}}[1h]))", "{{kind}}"),
              width=12, stacked=True),
        graph("Clients with anomalies", f"Anomalies counted since kproxy started, by client id and kind, the "
              f"{TOP} with the most (a client's first anomaly shows here at once; rates and increases need a "
              "second).", "short",
              query(f"topk({TOP}, sum by (client_id, kind) (kproxy_client_anomalies_total{{{SEL_CLIENT}}}))",
                    "{{client_id}} {{kind}}"), width=12),
    ]


def variables() -> list[Builder[VariableModel]]:
    def label_values(name: str, label: str, expr: str, include_all: bool = True) -> dash.QueryVariable:
        v = (dash.QueryVariable(name).label(label).datasource(DATASOURCE)
             .query({"query": expr, "refId": f"{name}-values"})
             .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
             .multi(True).include_all(include_all))
        return v.all_value(".*") if include_all else v

    return [
        dash.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        label_values("job", "Job", "label_values(kproxy_build_info, job)"),
        label_values("namespace", "Namespace", 'label_values(kproxy_build_info{job=~"$job"}, namespace)'),
        label_values("pod", "Pod", 'label_values(kproxy_build_info{job=~"$job", namespace=~"$namespace"}, pod)'),
        label_values("instance", "Instance",
                     'label_values(kproxy_build_info{job=~"$job", namespace=~"$namespace", pod=~"$pod"}, instance)'),
        label_values("cluster", "Cluster", 'label_values(kproxy_requests_total{job=~"$job"}, cluster)'),
        label_values("api", "API", 'label_values(kproxy_requests_total{job=~"$job"}, api)'),
        label_values("node_id", "Broker (node id)", 'label_values(kproxy_requests_total{job=~"$job"}, node_id)'),
        label_values("topic", "Topic", 'label_values(kproxy_topic_bytes_total{job=~"$job"}, topic)'),
        label_values("client_id", "Client id", 'label_values(kproxy_client_bytes_total{job=~"$job"}, client_id)'),
        label_values("group", "Consumer group", 'label_values(kproxy_consumergroup_lag_sum{job=~"$job"}, group)'),
    ]


def build() -> dash.Dashboard:
    board = (dash.Dashboard("kproxy").uid(UID).tags(["kafka", "kproxy"]).editable()
             .description("kproxy, the Kafka-protocol-aware proxy: traffic, latency, Kafka error codes, "
                          "connections; traffic by topic and client, consumer lag and producers, read from the wire.")
             .tooltip(DashboardCursorSync.CROSSHAIR).time("now-1h", "now").refresh("30s").timezone("browser")
             .variables(variables()))
    rows: list[tuple[str, list[timeseries.Panel] | list[stat.Panel]]] = [
        ("Overview", overview_row()),
        ("Traffic", traffic_row()),
        # What a Kafka traffic dashboard shows first, read from the wire (opt-in labels; consumer lag).
        ("Topics", topics_row()),
        ("Clients", clients_row()),
        ("Consumer lag", lag_row()),
        ("Lag (seconds)", lag_seconds_row()),
        ("Producers", producers_row()),
        ("Client anomalies", anomalies_row()),
        ("Latency", latency_row()),
        ("Brokers", brokers_row()),
        ("Errors", errors_row()),
        ("Connections", connections_row()),
        ("Faults", faults_row()),
    ]
    for title, panels in rows:
        board = board.with_row(dash.Row(title))
        for panel in panels:
            board = board.with_panel(panel)
    return board


def render() -> str:
    """The dashboard as committed: stable key order, two-space indent, trailing newline."""
    data = json.loads(json.dumps(build().build(), cls=JSONEncoder))
    # Panel ids: Grafana needs them unique; number them in layout order.
    for n, panel in enumerate(data["panels"], start=1):
        panel["id"] = n
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is not up to date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run {Path(__file__).as_posix()} to regenerate it", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
