"""Traffic capture: one record per request/response pair, written for the analysis job.

:mod:`kproxy.capture.schema` (sans-IO, shared with :mod:`kproxy.analysis`) defines
the record; :mod:`kproxy.capture.writer` (needs pyarrow: the ``capture`` extra)
writes the files; :mod:`kproxy.capture.observer` builds records from a session's
exchanges, one observer per client connection.
"""
