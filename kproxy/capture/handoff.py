"""What the capture's shipper (in the proxy) and its worker process agree on, without pyarrow.

The proxy side (:mod:`kproxy.capture.shipper`) imports only this, so a proxy whose capture runs in
a worker process does not load pyarrow itself; the worker (:mod:`kproxy.capture.worker`) does.
"""

from __future__ import annotations

from typing import Any

from kproxy.capture.connection_info import ConnectionInfo

# The counters a worker's report carries (CaptureWriter's and RecordBuilder's, by these names), and
# ``open_records``: records written to the file still open (lost with it if the worker is killed).
COUNTERS = ("written", "dropped", "abandoned", "over_budget", "files_written", "files_deleted", "write_errors")
GAUGES = ("open_records",)
# A connection's close has this many fields (record_builder's ClosedConnection); an exchange more.
CLOSE_FIELDS = 5
# Connections each side keeps what it made of at most (the proxy its keys, the worker its
# ConnectionInfo): an entry goes with the connection's close, and should closes be lost (a full
# queue drops them), all go past this many, to be made again as items come.
CACHED_CONNECTIONS = 10_000
# The ConnectionInfo fields a connection key carries, in order (node_id is worked out from listener).
CONNECTION_FIELDS = ("connection_id", "client_host", "client_port", "listener", "upstream", "principal", "cluster")


def connection_key(conn: ConnectionInfo) -> tuple[Any, ...]:
    """What the worker needs of a connection, as plain values (a frozen dataclass with slots does
    not come back from a pickle)."""
    return (conn.connection_id, conn.client_host, conn.client_port, conn.listener, conn.upstream, conn.principal,
            conn.cluster)


def connection(key: tuple[Any, ...]) -> ConnectionInfo:
    """The connection a :func:`connection_key` was made of."""
    return ConnectionInfo(**dict(zip(CONNECTION_FIELDS, key, strict=True)))
