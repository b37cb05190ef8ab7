"""free_port: a port for a listener started next, one the kernel does not hand out meanwhile."""

from __future__ import annotations

import socket

import pytest

from kproxy.testing import free_port, tansu


def test_ports_come_from_below_the_ephemeral_range_and_are_bindable() -> None:
    low = tansu._ephemeral_low()
    if low - tansu.FREE_PORT_SPAN < 1024:
        pytest.skip(f"the kernel's ephemeral range starts at {low}: no room below it, free_port binds port 0")
    ports = [free_port() for _ in range(200)]
    assert all(low - tansu.FREE_PORT_SPAN <= p < low for p in ports), (low, sorted(ports)[:5], sorted(ports)[-5:])
    assert len(set(ports)) == len(ports)  # never the same port twice in one process
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # free, as promised


def test_a_kernel_that_does_not_say_gets_a_port_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tansu, "_ephemeral_low", lambda: 0)
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
