"""The capture worker: a process of its own that reads captured exchanges into Parquet files.

``python -m kproxy.capture.worker SETTINGS`` is started by :class:`kproxy.capture.shipper.CaptureShipper`
unless ``capture.process`` is off. Why a process: the capture's reading and writing is Python work that
holds the GIL, and in the proxy's process a thread doing it shares the GIL with the event loop: the
loop waits for the lock while the writer holds it, and longest when the kernel has left the writer
off a busy core (a lower priority for that thread makes it worse). In a process of its own the
work takes no lock the loop needs, and it runs at a lower priority, so on cores the proxy shares
with others the kernel serves the proxy first.

Contract:

* SETTINGS is a JSON object: the capture directory and its rotation and cap, the writer's queue
  size, the payload options, the files' metadata and the run's log level and format (its lines
  go to the stderr it shares with the proxy, formatted as the proxy's). Its priority is the parent's to set (it is
  set as the process starts, before anything is read).
* Standard input carries batches: a 4-byte big-endian length, then a pickle (trusted: only the
  parent writes this pipe) of a list of items, each a :data:`kproxy.capture.record_builder.Captured`
  or ``ClosedConnection`` tuple whose connection is given as
  :func:`kproxy.capture.handoff.connection_key`'s tuple instead of a
  :class:`~kproxy.capture.connection_info.ConnectionInfo`, and a frame of
  ``kproxy.capture.shipper.INLINE_BYTES`` or more given as its size, its bytes following the
  pickle, in the items' order (request, then response). Each item goes to the writer's queue
  in order (:class:`kproxy.capture.writer.CaptureWriter`: a full queue drops and counts).
* Standard output carries the counters, one JSON line (:data:`kproxy.capture.handoff.COUNTERS`,
  ``GAUGES``) every :data:`REPORT_SECONDS`, and a last one once standard input ends and the
  writer has written what it had and completed its file. Then the process exits 0.
* Its writer runs each turn whole (``beside_loop=False``): no event loop shares this process's GIL,
  and the collector is tuned as the proxy's is (:mod:`kproxy.memory`).
* A batch cut short (the parent killed mid-write) ends the input like an end of file. SIGINT and
  SIGTERM are ignored: the worker ends when its input does, so a proxy stopped in any way (a
  terminal's Ctrl-C reaches the whole process group; SIGKILL closes the pipe) leaves complete files.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

from kproxy.capture.connection_info import ConnectionInfo
from kproxy.capture.handoff import CACHED_CONNECTIONS, CLOSE_FIELDS, connection
from kproxy.capture.record_builder import PayloadOptions, RecordBuilder
from kproxy.capture.writer import CaptureWriter
from kproxy.logfmt import q, setup_logging
from kproxy.memory import freeze_start_up, tune_gc
from kproxy.protocol.topic_ids import TopicIdNames

log = logging.getLogger("kproxy.capture")

# A report this often, whether items come or not.
REPORT_SECONDS = 1.0


def counters(writer: CaptureWriter, builder: RecordBuilder) -> dict[str, int]:
    """The worker's counters now (:data:`kproxy.capture.handoff.COUNTERS` and ``GAUGES``)."""
    return {"written": writer.written, "dropped": writer.dropped, "abandoned": writer.abandoned,
            "over_budget": builder.over_budget, "files_written": writer.files_written,
            "files_deleted": writer.files_deleted, "write_errors": writer.write_errors,
            "open_records": writer.open_records}


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def serve(settings: dict[str, Any], stdin: BinaryIO, stdout: Any) -> None:
    """Read batches from ``stdin`` into a capture writer until it ends; counters to ``stdout``."""
    builder = RecordBuilder(TopicIdNames(), PayloadOptions(include=bool(settings["include_payloads"]),
                                                           max_bytes=int(settings["payload_max_bytes"])))
    writer = CaptureWriter(Path(settings["dir"]), max_bytes_total=int(settings["max_bytes_total"]),
                           rotate_bytes=int(settings["rotate_bytes"]),
                           rotate_seconds=float(settings["rotate_seconds"]),
                           queue_size=int(settings["queue_size"]), rows=builder.rows, add_rows=builder.add_rows,
                           metadata=settings.get("metadata"), beside_loop=False)
    writer.start()
    log.info("event=capture_worker_serving pid=%d dir=%s", os.getpid(), q(settings["dir"]))
    offer = writer.queue.offer
    connections: dict[tuple[Any, ...], ConnectionInfo] = {}

    lock = threading.Lock()
    done = threading.Event()

    def report() -> None:
        with lock:
            stdout.write(json.dumps(counters(writer, builder)) + "\n")
            stdout.flush()

    def reports() -> None:
        while not done.wait(REPORT_SECONDS):
            report()

    threading.Thread(target=reports, name="kproxy-capture-reports", daemon=True).start()
    try:
        while True:
            head = _read_exactly(stdin, 4)
            body = None if head is None else _read_exactly(stdin, int.from_bytes(head, "big"))
            if body is None:
                break
            items = pickle.loads(body)
            for item in items:
                key = item[0]
                conn = connections.get(key)
                if conn is None:
                    if len(connections) >= CACHED_CONNECTIONS:
                        connections.clear()
                    conn = connections[key] = connection(key)
                if len(item) <= CLOSE_FIELDS:  # the connection's last item
                    del connections[key]
                    offer((conn, *item[1:]), 0)
                    continue
                request, response = item[3], item[4]
                if type(request) is int:  # a big frame, sent after the pickle: its size
                    request = _read_exactly(stdin, request)
                if type(response) is int:
                    response = _read_exactly(stdin, response)
                if request is None or (response is None and type(item[4]) is int):
                    return  # the input ended inside a batch
                held = len(request) if type(request) is bytes else 0
                if type(response) is bytes:
                    held += len(response)
                offer((conn, item[1], item[2], request, response, *item[5:]), held)
    finally:
        writer.close()
        done.set()
        report()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kproxy.capture.worker SETTINGS_JSON", file=sys.stderr)
        return 2
    # The worker ends when its input does, having completed its file: not on the Ctrl-C a terminal
    # sends the whole process group, nor on a SIGTERM meant for the proxy (which then closes the
    # input). A proxy killed outright closes it too. (The shipper starts it with both blocked;
    # ignored now, they are unblocked.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    settings = json.loads(args[0])
    # As the proxy's own process: the rows are tuples kept a row group long, and what the imports
    # loaded (pyarrow above all) stays out of every collection.
    tune_gc()
    freeze_start_up()
    # Its lines (a failing disk, a frame over budget) on the proxy's stderr, as the proxy writes its own.
    setup_logging(str(settings.get("log_level", "info")), str(settings.get("log_format", "logfmt")))
    serve(settings, sys.stdin.buffer, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
