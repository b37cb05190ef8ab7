"""The Helm chart's ``kproxy.clusters`` (docs/CLUSTERS.md): several clusters in a sidecar's kproxy.yaml.

Rendered with helm-python-sdk as the other chart tests do; the rendered kproxy.yaml is read by
kproxy's own config loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kproxy.config import config_from_file
from kproxy.host_port import HostPort
from tests.test_chart_operations import helm, render  # noqa: F401 (helm: the fixture)
from tests.test_deploy_artifacts import one

CLUSTERS = [{"name": "old", "upstream": ["kafka-0.old.svc:9093", "kafka-1.old.svc:9093"], "bootstrapPort": 19092,
             "brokerPortBase": 19093},
            {"name": "new", "upstream": "kafka-0.new.svc:9093", "bootstrapPort": 19292, "brokerPortBase": 19293,
             "brokerPortCount": 10}]


def test_a_sidecar_serves_each_cluster_on_its_own_ports(helm: Any, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm, {"mode": "sidecar", "kproxy": {"clusters": CLUSTERS}}, "orders")
    text = one(docs, "ConfigMap")["data"]["kproxy.yaml"]
    written = yaml.safe_load(text)
    assert "upstream" not in written and "listen" not in written and "broker_port_base" not in written
    (tmp_path / "kproxy.yaml").write_text(text)
    config = config_from_file(tmp_path / "kproxy.yaml")
    by_name = {cluster.name: cluster for cluster in config.every_cluster}  # (Helm writes them in name order)
    old, new = by_name["old"], by_name["new"]
    assert set(by_name) == {"old", "new"}
    assert (old.name, old.upstream, old.listen, old.advertised, old.first_broker_port, old.last_broker_port) == (
        "old", (HostPort("kafka-0.old.svc", 9093), HostPort("kafka-1.old.svc", 9093)), HostPort("127.0.0.1", 19092),
        "127.0.0.1", 19093, 19192)
    assert (new.name, new.listen, new.first_broker_port, new.last_broker_port) == (
        "new", HostPort("127.0.0.1", 19292), 19293, 19302)


@pytest.mark.parametrize(("values", "why"), [
    ({"kproxy": {"clusters": CLUSTERS}}, "kproxy.clusters is for mode: sidecar"),
    ({"mode": "sidecar", "kproxy": {"clusters": [{**CLUSTERS[0], "name": "Old"}]}}, "name"),
    ({"mode": "sidecar", "kproxy": {"clusters": [{"name": "old", "upstream": "k:1"}]}}, "bootstrapPort"),
])
def test_clusters_the_chart_cannot_serve_are_refused(helm: Any, values: dict[str, Any], why: str) -> None:  # noqa: F811
    with pytest.raises(Exception, match=why):
        render(helm, values, "orders")
