"""``clusters:``: several clusters in one configuration, from the file, the environment and flags.

Each cluster has its own upstream, listeners, broker port range, upstream TLS and login; the
configuration without ``clusters:`` is one cluster named ``default``, as it always was.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kproxy.cli import main
from kproxy.config import ConfigError, config_from_file
from kproxy.config.layering import build_config
from kproxy.config.sections import DEFAULT_CLUSTER
from kproxy.host_port import HostPort

TWO = """\
tls:
  upstream: {verify: false}
clusters:
  orders:
    upstream: [127.0.0.1:9092]
    listen: 127.0.0.1:20000
  payments:
    upstream: 127.0.0.1:9093
    listen: 127.0.0.1:20200
    broker_port_count: 10
    advertised_host: kproxy.local
    tls:
      upstream: {enabled: true}
"""


@pytest.fixture(autouse=True)
def _no_kproxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("KPROXY_"):
            monkeypatch.delenv(name)


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    status = main(["run", "--check", *argv])
    out, err = capsys.readouterr()
    return status, [line.removeprefix("kproxy run: invalid configuration: ") for line in err.splitlines()], out


def test_a_configuration_without_clusters_is_the_one_cluster_default() -> None:
    config = build_config({"upstream": ("k:1", "test"), "broker_port_base": ("30000", "test")})
    assert config.clusters == ()
    (cluster,) = config.every_cluster
    assert cluster.name == DEFAULT_CLUSTER == "default"
    assert (cluster.upstream, cluster.listen, cluster.first_broker_port, cluster.last_broker_port) == (
        (HostPort("k", 1),), HostPort("127.0.0.1", 19092), 30000, 65535)
    assert config.cluster_config(cluster) == config  # serving it is serving the configuration as it is


def test_each_cluster_has_its_own_listeners_port_range_and_upstream_tls(tmp_path: Path) -> None:
    conf = tmp_path / "kproxy.yaml"
    conf.write_text(TWO)
    config = config_from_file(conf)
    orders, payments = config.every_cluster
    assert (orders.name, orders.upstream, orders.listen) == ("orders", (HostPort("127.0.0.1", 9092),),
                                                             HostPort("127.0.0.1", 20000))
    assert (orders.first_broker_port, orders.last_broker_port) == (20001, 20100)  # 100 ports by default
    assert (payments.first_broker_port, payments.last_broker_port) == (20201, 20210)
    assert payments.advertised == "kproxy.local" and orders.advertised == "127.0.0.1"
    # The top level's upstream TLS is every cluster's default; a cluster's own section wins.
    assert (orders.upstream_tls.enabled, orders.upstream_tls.verify) == (False, False)
    assert (payments.upstream_tls.enabled, payments.upstream_tls.verify) == (True, False)
    served = config.cluster_config(payments)
    assert (served.cluster, served.upstream, served.listen, served.upstream_tls, served.last_broker_port) == (
        "payments", payments.upstream, payments.listen, payments.upstream_tls, 20210)


def test_clusters_from_the_environment_and_flags_override_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "kproxy.yaml"
    conf.write_text(TWO)
    monkeypatch.setenv("KPROXY_CLUSTERS_ORDERS_UPSTREAM", "10.0.0.1:9092,10.0.0.2:9092")
    monkeypatch.setenv("KPROXY_CLUSTERS_EU_WEST_UPSTREAM", "10.1.0.1:9092")  # a '-' of the name is a '_'
    status, err, out = _check(capsys, "--config", str(conf), "--clusters-eu-west-listen", "127.0.0.1:20400",
                              "--clusters-orders-upstream=10.0.0.3:9092", "--no-clusters-payments-tls-upstream-enabled")
    assert (status, err) == (0, [])
    assert out == ("kproxy run --check: configuration ok (cluster orders: upstream 10.0.0.3:9092, listen "
                   "127.0.0.1:20000; cluster payments: upstream 127.0.0.1:9093, listen 127.0.0.1:20200; "
                   "cluster eu-west: upstream 10.1.0.1:9092, listen 127.0.0.1:20400)\n")


def test_every_problem_of_the_clusters_is_reported_at_its_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "kproxy.yaml"
    conf.write_text("""\
upstream: 127.0.0.1:9092
clusters:
  orders:
    upstream: 127.0.0.1:9092
    listen: 127.0.0.1:20000
    limits: {max_in_flight: 3}
  Orders_2: {}
  orders: {}
  lonely:
    listen: 127.0.0.1:21000
    broker_port_base: many
""")
    status, err, _ = _check(capsys, "--config", str(conf))
    assert status == 2
    assert err == [
        f"{conf}:1: upstream: with clusters, each cluster has its own (clusters.NAME.upstream); not at the top level",
        f"{conf}:6: clusters.orders.limits: not an option of a cluster",
        f"{conf}:7: clusters.Orders_2: a cluster's name must be lower-case letters, digits and '-' (not first or "
        f"last), at most 63, got 'Orders_2'",
        f"{conf}:8: clusters.orders: duplicate cluster (first at line 3)",
        f"{conf}:11: clusters.lonely.broker_port_base: must be an integer >= 0, got 'many'",
    ]


def test_clusters_whose_ports_collide_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "kproxy.yaml"
    conf.write_text("""\
clusters:
  orders:
    upstream: 127.0.0.1:9092
    listen: 0.0.0.0:20000
  payments:
    upstream: 127.0.0.1:9093
    listen: 127.0.0.1:20050
    broker_ports: {"3": 20001}
  audit:
    upstream: 127.0.0.1:9094
""")
    status, err, _ = _check(capsys, "--config", str(conf))
    assert status == 2
    assert err == [
        f"{conf}:5: clusters.payments: its bootstrap port 20050 and the broker ports 20001-20100 of cluster "
        f"'orders' overlap",
        f"{conf}:5: clusters.payments: its broker ports 20051-20150 and the broker ports 20001-20100 of cluster "
        f"'orders' overlap",
        f"{conf}:5: clusters.payments: its broker 3's port 20001 and the broker ports 20001-20100 of cluster "
        f"'orders' overlap",
        "clusters.audit.listen: required (--clusters-audit-listen, 'listen:' in the cluster's section of the "
        "config file, or KPROXY_CLUSTERS_AUDIT_LISTEN)",
    ]
    # Another host: the same ports are no collision.
    conf.write_text(conf.read_text().replace("0.0.0.0:20000", "127.0.0.2:20000").replace(
        "  audit:\n    upstream: 127.0.0.1:9094\n", ""))
    assert _check(capsys, "--config", str(conf))[:2] == (0, [])


def test_a_cluster_flag_without_its_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--check", "--clusters-orders-upstream"]) == 2
    assert "--clusters-orders-upstream: expected a value (HOST:PORT)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"clusters\.orders\.upstream: required"):
        build_config({"clusters.orders.listen": ("127.0.0.1:1", "test")})
