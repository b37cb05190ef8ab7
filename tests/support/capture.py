"""Capture records made up for tests, with distributions the tests know exactly."""

from __future__ import annotations

from typing import Any

from kproxy.capture.record_schema import new_record

T0_US = 1_790_000_000_000_000  # 2026-09-21T14:13:20Z: a fixed start, so hours are predictable


def record(i: int, *, at_us: int | None = None, api_key: int = 0, api_name: str = "Produce",
           **values: Any) -> dict[str, Any]:
    """The ``i``-th made-up record (request ``i`` of connection ``c{i % 3}``), ``values`` over it."""
    base: dict[str, Any] = {
        "request_time": T0_US + i * 1000 if at_us is None else at_us,
        "connection_id": f"c{i % 3}", "client_host": "127.0.0.1", "client_port": 40000 + i % 3,
        "client_id": "gen", "listener": "bootstrap", "api_key": api_key, "api_name": api_name,
        "api_version": 9, "correlation_id": i, "request_bytes": 100, "response_bytes": 50,
        "broker_latency_ms": 1.0, "kproxy_latency_ms": 0.01,
    }
    base.update(values)
    return new_record(**base)
