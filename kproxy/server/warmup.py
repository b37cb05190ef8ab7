"""Compile, at start-up, the codecs the first clients will need.

kproxy compiles a message kind's code on first use (a few milliseconds each).
Left to the first request of each kind, that shows as a latency spike in the
very metrics users watch. After broker discovery the server knows the
versions the broker speaks, hence the ones clients will choose (the highest
both sides speak, capped by what kproxy reads), and compiles those ahead,
in a worker thread, so that the event loop keeps serving. Which kinds is derived in
:func:`kproxy.protocol.kinds.warm_up_kinds`.
"""

from __future__ import annotations

import logging
import time

import trio

from kproxy.protocol.kinds import VERSIONS_BELOW, warm_up_kinds
from kproxy.protocol.message_schemas import MessageType
from kproxy.protocol.messages import codec
from kproxy.protocol.offset_reads import OFFSET_FIELDS
from kproxy.protocol.scan import scanner
from kproxy.proxy.address_rewrite import ResponseRewriter

__all__ = ["VERSIONS_BELOW", "warm_up"]

log = logging.getLogger("kproxy.server")


async def warm_up(broker_versions: dict[int, int], rewriter: ResponseRewriter) -> int:
    """Compile scanners (metrics) and, where responses are rewritten, codecs; return how many kinds."""
    started = time.perf_counter()
    kinds = 0
    for api_key, version in warm_up_kinds(broker_versions, VERSIONS_BELOW):
        # In a worker thread: compiling one kind is a long run of Python,
        # which on the loop would hold every connection. The caches are plain dicts: a client's
        # request compiling the same kind at the same time costs a second compile, never a wrong codec.
        await trio.to_thread.run_sync(_compile, api_key, version, rewriter)
        kinds += 1
    log.info("event=codecs_warmed kinds=%d seconds=%.3f", kinds, time.perf_counter() - started)
    return kinds


def _compile(api_key: int, version: int, rewriter: ResponseRewriter) -> None:
    for direction in (MessageType.REQUEST, MessageType.RESPONSE):
        scanner(api_key, version, direction, errors_only=True)
        if (api_key, direction) in OFFSET_FIELDS:  # what consumer lag reads (metrics.consumer_lag, the default)
            scanner(api_key, version, direction, errors_only=direction is MessageType.RESPONSE, values=True)
    if rewriter.needs_rewrite(api_key, version):
        codec(api_key, version, MessageType.RESPONSE)
