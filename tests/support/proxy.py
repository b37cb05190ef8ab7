"""Tests use the same background runner as the demo."""

from kproxy.server.background import ProxyThread, proxy_config, running_proxy

__all__ = ["ProxyThread", "proxy_config", "running_proxy"]
