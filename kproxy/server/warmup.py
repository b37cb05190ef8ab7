"""Compile, at start-up, the codecs the first clients will need.

kproxy compiles a message kind's code on first use (a few milliseconds each).
Left to the first request of each kind, that shows as a latency spike in the
very metrics users watch. After broker discovery the server knows the
versions the broker speaks, hence the ones clients will choose (the highest
both sides speak, capped by what kproxy reads), and compiles those ahead,
yielding to the event loop between kinds.
"""

from __future__ import annotations

import logging
import time

import trio

from kproxy.protocol.messages import codec
from kproxy.protocol.scan import scanner
from kproxy.protocol.schema import Direction, supported_versions
from kproxy.proxy.rewrite import ResponseRewriter

log = logging.getLogger("kproxy.server")

# The APIs every producer, consumer and admin client uses from its first seconds.
CLIENT_APIS = (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 18, 19, 22, 32, 60)
# Clients older than the broker pick lower versions than the highest both sides speak
# (librdkafka 2.16 asks ApiVersions v3 and Produce v10 of a broker speaking v4 and v11).
VERSIONS_BELOW = 4


async def warm_up(broker_versions: dict[int, int], rewriter: ResponseRewriter) -> int:
    """Compile scanners (metrics) and, where responses are rewritten, codecs; return how many kinds."""
    started = time.perf_counter()
    kinds = 0
    for api_key in CLIENT_APIS:
        ours = supported_versions(api_key)
        theirs = broker_versions.get(api_key)
        if ours is None or theirs is None:
            continue
        top = min(ours[1], theirs)
        for version in range(top, max(ours[0], top - VERSIONS_BELOW) - 1, -1):
            for direction in (Direction.REQUEST, Direction.RESPONSE):
                scanner(api_key, version, direction, errors_only=True)
            if rewriter.needs_rewrite(api_key, version):
                codec(api_key, version, Direction.RESPONSE)
            kinds += 1
            await trio.sleep(0)  # one kind at a time: clients already connected keep being served
    log.info("event=codecs_warmed kinds=%d seconds=%.3f", kinds, time.perf_counter() - started)
    return kinds
