"""The shortest end-to-end check: a real client, through kproxy, to a real broker."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from kproxy.testing import ProxyThread


def test_metadata_through_kproxy_advertises_only_kproxy_ports(proxy: ProxyThread) -> None:
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    md = admin.list_topics(timeout=10)
    assert md.brokers, "the broker list came back empty"
    assert proxy.server is not None
    kproxy_ports = set(proxy.server.listeners)
    for broker in md.brokers.values():
        assert broker.host == "127.0.0.1"
        assert broker.port in kproxy_ports
