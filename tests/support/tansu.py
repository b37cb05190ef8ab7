"""Tests use the same embedded Tansu broker as the demo."""

from kproxy.tools.tansu import Broker, free_port, run_tansu, wait_for_port

__all__ = ["Broker", "free_port", "run_tansu", "wait_for_port"]
