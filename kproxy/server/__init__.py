"""The I/O layer: trio listeners, client connections, upstream connections.

Protocol decisions live in :mod:`kproxy.proxy` (sans-IO); this package moves
bytes, runs the sessions' commands, and hands session events to the logs, the
metrics observer and the capture.
"""
