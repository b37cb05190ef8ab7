"""The I/O layer: trio listeners, client connections, upstream connections.

The only kproxy code that awaits. Protocol decisions live in
:mod:`kproxy.proxy`; this package moves bytes and turns session events into
logs (and, later, metrics and capture records).
"""
