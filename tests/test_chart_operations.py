"""The chart as a platform team installs it: any release name, closed values, monitoring that works.

The alerts and the dashboard select on the Prometheus ``job`` label. prometheus-operator names
the job after the Service (ServiceMonitor) or the PodMonitor unless the monitor relabels it, so a
release not called ``kproxy`` would silently never fire ``KproxyDown``. These tests render the
chart under other names, turn the rendered monitors into the scrape configuration the operator
would generate, and let a real Prometheus evaluate the rendered PrometheusRule against it.
"""

from __future__ import annotations

import http.server
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from kproxy.testing import free_port
from tests.test_deploy_artifacts import CHART, ROOT, kinds, one
from tests.test_metrics_prometheus import run_prometheus, wait_until

NAMESPACE = "payments"
MONITORING = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
              "prometheusRule": {"enabled": True}}


@pytest.fixture(scope="module")
def helm() -> Any:
    import helm_python  # type: ignore[import-not-found,import-untyped,unused-ignore]

    return helm_python


def render(helm: Any, values: dict[str, Any], release: str) -> list[dict[str, Any]]:
    with helm.Chart.load(str(CHART)) as loaded:
        manifests: dict[str, str] = loaded.render(values, name=release, namespace=NAMESPACE)
    return [doc for template, text in sorted(manifests.items()) if not template.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


# -- closed values ----------------------------------------------------------------------------
@pytest.mark.parametrize(("values", "where"), [
    ({"kproxy": {"upstrem": ["kafka:9092"]}}, "'upstrem'"),
    ({"serviceMonitor": {"enabeld": True}}, "'enabeld'"),
    ({"replicas": 2}, "'replicas'"),
    ({"tls": {"upstream": {"verfy": False}}}, "'verfy'"),
    ({"networkPolicy": {"enabled": True, "clientsFrom": []}}, "'clientsFrom'"),
])
def test_a_misspelt_value_is_refused(helm: Any, values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmError, match=f"additional properties {re.escape(where)} not allowed"):
        render(helm, values, "kproxy")


def test_every_default_value_is_in_the_schema(helm: Any) -> None:
    """A closed schema must still accept the chart's own values.yaml, every section filled in."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    everything_on = {**values, **MONITORING, "networkPolicy": {"enabled": True},
                     "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1}}
    docs = render(helm, everything_on, "kproxy")
    assert kinds(docs) == sorted(["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "PodMonitor",
                                  "PrometheusRule", "Service", "ServiceAccount", "ServiceMonitor"])


# -- the job label ----------------------------------------------------------------------------
def operator_job(monitor: dict[str, Any], default_job: str) -> str:
    """The job label prometheus-operator gives the monitor's targets: the Service's (or the
    PodMonitor's namespace/name) by default, then the endpoint's relabelings, in order."""
    endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
    (endpoint,) = endpoints
    job = default_job
    for relabel in endpoint.get("relabelings", []):
        if relabel.get("targetLabel") == "job" and relabel.get("action", "replace") == "replace":
            assert "sourceLabels" not in relabel, "only constant replacements are modelled here"
            job = relabel["replacement"]
    return job


@pytest.mark.parametrize("release", ["kproxy", "orders-edge", "kafka-gateway-canary"])
def test_monitors_give_the_job_the_alerts_select(helm: Any, release: str) -> None:
    docs = render(helm, MONITORING, release)
    service = one(docs, "Service")["metadata"]["name"]
    pod_monitor = one(docs, "PodMonitor")
    assert operator_job(one(docs, "ServiceMonitor"), default_job=service) == "kproxy"
    assert operator_job(pod_monitor, default_job=f"{NAMESPACE}/{pod_monitor['metadata']['name']}") == "kproxy"
    exprs = [r["expr"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert 'up{job="kproxy"} == 0' in exprs


def test_monitoring_job_is_one_setting(helm: Any) -> None:
    docs = render(helm, {**MONITORING, "monitoringJob": "kafka-proxy"}, "edge")
    assert operator_job(one(docs, "ServiceMonitor"), default_job="edge-kproxy") == "kafka-proxy"
    exprs = [r["expr"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert 'up{job="kafka-proxy"} == 0' in exprs
    assert not any('job="kproxy"' in e for e in exprs)


def test_every_alert_links_its_runbook_section_and_the_chart_can_rebase_it(helm: Any) -> None:
    """runbook_url: docs/RUNBOOK.md#<alert>, a section that exists; the chart puts a base in front."""
    runbook = (ROOT / "docs" / "RUNBOOK.md").read_text()
    sections = {line[3:].strip().lower() for line in runbook.splitlines() if line.startswith("## ")}
    rules = [r for g in yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"]
             for r in g["rules"]]
    for rule in rules:
        assert rule["annotations"].get("runbook_url") == f"docs/RUNBOOK.md#{rule['alert'].lower()}", rule["alert"]
        assert rule["alert"].lower() in sections, f"no '## {rule['alert']}' section in docs/RUNBOOK.md"
    base = "https://git.example.com/platform/kproxy/-/blob/main"
    docs = render(helm, {**MONITORING, "prometheusRule": {"enabled": True, "runbookBaseUrl": base + "/",
                                                          "optInAlerts": opt_in_alerts()}}, "edge")
    urls = [r["annotations"]["runbook_url"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert urls == [f"{base}/docs/RUNBOOK.md#{r['alert'].lower()}" for r in rules]


def opt_in_alerts() -> list[str]:
    """The alerts of alerts.yml's opt-in group."""
    groups = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"]
    return [r["alert"] for g in groups if g["name"] == "kproxy-opt-in" for r in g["rules"]]


def rendered_alerts(helm: Any, values: dict[str, Any]) -> dict[str, list[str]]:
    docs = render(helm, {**MONITORING, "prometheusRule": {"enabled": True, **values}}, "edge")
    return {g["name"]: [r["alert"] for r in g["rules"]] for g in one(docs, "PrometheusRule")["spec"]["groups"]}


def test_opt_in_alerts_are_off_unless_named(helm: Any) -> None:
    """KproxyUncompressedProduce (a client habit, not a kproxy or cluster problem) is in alerts.yml's
    opt-in group: the chart renders it only when prometheusRule.optInAlerts names it."""
    assert opt_in_alerts() == ["KproxyUncompressedProduce"]
    default = rendered_alerts(helm, {})
    assert list(default) == ["kproxy"]
    assert "KproxyConsumerLagGrowing" in default["kproxy"]
    assert "KproxyUncompressedProduce" not in default["kproxy"]
    enabled = rendered_alerts(helm, {"optInAlerts": ["KproxyUncompressedProduce"]})
    assert enabled == {**default, "kproxy-opt-in": ["KproxyUncompressedProduce"]}
    with pytest.raises(helm.HelmError, match="optInAlerts"):
        rendered_alerts(helm, {"optInAlerts": ["KproxyUncompresedProduce"]})


def test_chart_alerts_are_deploy_alerts() -> None:
    """The chart cannot read files outside itself: it carries a copy, kept identical here."""
    assert (CHART / "files" / "alerts.yml").read_bytes() == (ROOT / "deploy" / "prometheus" / "alerts.yml").read_bytes()


def test_sidecar_pod_monitor_needs_a_selector(helm: Any) -> None:
    with pytest.raises(helm.HelmError, match=r"podMonitor\.selector"):
        render(helm, {"mode": "sidecar", "podMonitor": {"enabled": True}}, "orders")
    docs = render(helm, {"mode": "sidecar", "podMonitor": {"enabled": True, "selector": {"app": "orders"}}}, "orders")
    monitor = one(docs, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {"app": "orders"}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "kproxy-metrics"


class _Metrics(http.server.BaseHTTPRequestHandler):
    """Something up to scrape beside the target that is down."""

    def do_GET(self) -> None:
        body = b"kproxy_build_info{version=\"test\"} 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_kproxy_down_fires_for_any_release_name(helm: Any, tmp_path: Path) -> None:
    """A real Prometheus, configured the way the operator configures it from the rendered
    ServiceMonitor (job = Service name, then the monitor's relabelings), evaluating the rendered
    PrometheusRule: KproxyDown goes pending for the target that is down, not for the one that is up."""
    docs = render(helm, MONITORING, "orders-edge")
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")["metadata"]["name"]
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": one(docs, "PrometheusRule")["spec"]["groups"]}))
    down = f"127.0.0.1:{free_port()}"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    up = f"127.0.0.1:{server.server_address[1]}"
    relabel_configs = [{"target_label": "job", "replacement": service}] + [
        {"target_label": r["targetLabel"], "replacement": r["replacement"], "action": r.get("action", "replace")}
        for r in monitor["spec"]["endpoints"][0]["relabelings"]]
    scrape = [{"job_name": f"serviceMonitor/{NAMESPACE}/{monitor['metadata']['name']}/0",
               "static_configs": [{"targets": [down, up]}], "relabel_configs": relabel_configs}]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with run_prometheus(tmp_path, [], rule_files=[rules], scrape_configs=scrape) as prom:
            fired = wait_until("KproxyDown to go pending",
                               lambda: prom.query('ALERTS{alertname="KproxyDown"}'), timeout=30)
            assert [a["metric"]["instance"] for a in fired] == [down]
            assert fired[0]["metric"]["job"] == "kproxy"
            # Both targets are scraped once a second, not necessarily in the same round.
            wait_until("the up target to be scraped", lambda: prom.value(f'up{{instance="{up}"}}') == 1.0,
                       timeout=30)
            assert [a["metric"]["instance"] for a in prom.query('ALERTS{alertname="KproxyDown"}')] == [down]
    finally:
        server.shutdown()
        server.server_close()
