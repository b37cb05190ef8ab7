"""The capture of one kproxy process: the writer, and an observer per client connection.

Imported only when capture is configured: its writer needs pyarrow (the ``capture``
extra), which the proxy does not carry otherwise (with ``capture.process``, the default, the
worker process loads it, the proxy does not).
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from kproxy.capture.observer import CaptureObserver, ConnectionInfo, Identity, Tee, split_peer
from kproxy.capture.record_builder import PayloadOptions, RecordBuilder
from kproxy.capture.record_schema import ANOMALY_METADATA_KEY
from kproxy.capture.shipper import CaptureShipper
from kproxy.config import CaptureOptions
from kproxy.paths import OptionFailed
from kproxy.protocol.topic_ids import TopicIdNames
from kproxy.proxy.principal import tls_principal
from kproxy.proxy.session import SessionObserver

if TYPE_CHECKING:
    from kproxy.capture.writer import CaptureWriter


class CaptureService:
    """``start()`` once, ``observer(...)`` per connection, ``close()`` at shutdown."""

    def __init__(self, options: CaptureOptions, anomalies: dict[str, Any] | None = None,
                 log_settings: tuple[str, str] = ("info", "logfmt")) -> None:
        """``anomalies``: the client anomaly detectors' settings, by name (None: none counted), for the
        capture files' metadata (:data:`~kproxy.capture.record_schema.ANOMALY_METADATA_KEY`);
        ``log_settings``: the run's log level and format, which a worker process logs with too."""
        assert options.dir is not None
        self.topics = TopicIdNames()
        self.payloads = PayloadOptions(include=options.include_payloads, max_bytes=options.payload_max_bytes)
        metadata = None if anomalies is None else {ANOMALY_METADATA_KEY: json.dumps(anomalies, sort_keys=True)}
        # Observers offer captured exchanges; the writer thread reads them (RecordBuilder), off the loop,
        # or (capture.process) a worker process does, fed by the shipper's thread.
        self.builder: RecordBuilder | None = None
        self.writer: CaptureWriter | CaptureShipper
        if options.process:
            self.writer = CaptureShipper(options.dir, max_bytes_total=options.max_bytes_total,
                                         rotate_bytes=options.rotate_bytes, rotate_seconds=options.rotate_seconds,
                                         queue_size=options.queue_size, include_payloads=options.include_payloads,
                                         payload_max_bytes=options.payload_max_bytes, metadata=metadata,
                                         log_settings=log_settings)
        else:
            from kproxy.capture.writer import CaptureWriter  # pyarrow: loaded where the files are written

            self.builder = RecordBuilder(self.topics, self.payloads)
            self.writer = CaptureWriter(options.dir, max_bytes_total=options.max_bytes_total,
                                        rotate_bytes=options.rotate_bytes, rotate_seconds=options.rotate_seconds,
                                        queue_size=options.queue_size, rows=self.builder.rows,
                                        add_rows=self.builder.add_rows, metadata=metadata)
        # Wall time of the sessions' perf_counter clock, read once: every connection's records on one
        # time line (the what-if orders requests across connections by it, kproxy.analysis.whatif).
        self.clock_offset = time.time() - time.perf_counter()
        # Connection ids unique across processes writing to one directory: pid and start time.
        self._prefix = f"{os.getpid():x}-{int(time.time()):x}"
        self._connections = 0

    def start(self) -> None:
        """Opens the capture directory; raises :class:`kproxy.paths.OptionFailed` naming ``capture.dir``
        when it cannot (so that the start failure names the option, not a listener)."""
        try:
            self.writer.start()
        except OSError as exc:
            raise OptionFailed("capture.dir", str(self.writer.directory), exc) from exc

    def close(self) -> None:
        self.writer.close()

    def observer(self, metrics: SessionObserver | None, *, peer: str, listener: str, upstream: str,
                 client: Any = None, identity: Identity | None = None, cluster: str | None = None) -> SessionObserver:
        """The observer of one new connection: capture, behind ``metrics`` when there is one.

        ``identity`` is the connection's session: records carry its principal. Without one,
        ``client``, the client stream: a TLS client certificate's subject is the principal.
        """
        self._connections += 1
        host, port = split_peer(peer)
        conn = ConnectionInfo(connection_id=f"{self._prefix}-{self._connections}", client_host=host,
                              client_port=port, listener=listener, upstream=upstream,
                              principal=_tls_subject(client), cluster=cluster)
        # (reader: big frames read at once on the loop, not held; a worker process is handed them whole,
        # its own reader knowing the topic ids that Fetch answers name)
        capture = CaptureObserver(conn, self.writer.queue.offer, self.clock_offset, reader=self.builder,
                                  identity=identity)
        return capture if metrics is None else Tee(metrics, capture)

    def connection_closed(self, observer: SessionObserver | None, reason: str | None = None) -> None:
        """Record the requests ``observer``'s connection left unanswered, and its close (``reason``:
        why; see :meth:`CaptureObserver.close`)."""
        capture = observer.second if isinstance(observer, Tee) else observer
        if isinstance(capture, CaptureObserver):
            capture.close(reason)

    def counts(self) -> dict[str, int]:
        """Records by outcome, for ``kproxy_capture_records_total``."""
        return {"written": self.writer.written, "dropped": self.writer.dropped, "abandoned": self.writer.abandoned}

    @property
    def over_budget(self) -> int:
        """Frames whose records were read no further (over their budget), for the metrics."""
        if isinstance(self.writer, CaptureShipper):
            return self.writer.over_budget
        return self.builder.over_budget if self.builder is not None else 0


def _tls_subject(client: Any) -> str | None:
    """The principal of a verified TLS client certificate (``User:CN=...,O=...``: see
    :func:`kproxy.proxy.principal.tls_principal`), else None."""
    getpeercert = getattr(client, "getpeercert", None)
    if getpeercert is None:
        return None
    try:
        cert = getpeercert()
    except (ValueError, AttributeError):  # handshake not done / not TLS
        return None
    return tls_principal(cert)
