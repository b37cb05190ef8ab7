"""kproxy: a Kafka-protocol-aware transparent TCP proxy."""

__version__ = "0.1.0"
