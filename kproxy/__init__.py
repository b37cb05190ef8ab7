"""kproxy: a Kafka-protocol-aware transparent TCP proxy."""

from kproxy import native

__version__ = "0.1.0"

# Before anything else of kproxy is imported: the compiled hot path, when built and fresh (kproxy/native.py).
native.activate()
