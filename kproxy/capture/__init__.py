"""Traffic capture: one record per request/response pair, written for the analysis job.

:mod:`kproxy.capture.record_schema` (sans-IO, shared with :mod:`kproxy.analysis`) defines
the record; :mod:`kproxy.capture.observer` takes what a record needs from a
session's exchanges on the event loop (references to the frames, a few numbers;
one observer per client connection); :mod:`kproxy.capture.record_builder` reads them
into records and :mod:`kproxy.capture.writer` (needs pyarrow: the ``capture`` extra) writes the
files, in :mod:`kproxy.capture.worker`, a process of its own fed by :mod:`kproxy.capture.shipper`'s
thread, or with ``capture.process: false`` on a writer thread of the proxy's process.
"""
