"""Start-up compilation of the codecs clients will pick."""

from __future__ import annotations

from kproxy.protocol import scan
from kproxy.protocol.schema import Direction
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.rewrite import ResponseRewriter
from kproxy.server.warmup import VERSIONS_BELOW, warm_up

PRODUCE, METADATA = 0, 3


async def test_warm_up_compiles_the_versions_below_the_broker_max() -> None:
    # Versions chosen so that no other test is likely to have compiled these scanners already.
    scan._scanners.clear()
    kinds = await warm_up({PRODUCE: 5, METADATA: 6}, ResponseRewriter(AddressMap("h", 1000)))
    assert kinds == 2 * (VERSIONS_BELOW + 1)
    for api_key, top in ((PRODUCE, 5), (METADATA, 6)):
        for version in range(top - VERSIONS_BELOW, top + 1):
            for direction in (Direction.REQUEST, Direction.RESPONSE):
                assert (api_key, version, direction, True) in scan._scanners
    assert (PRODUCE, 6, Direction.REQUEST, True) not in scan._scanners  # above what the broker speaks


async def test_warm_up_skips_apis_the_broker_does_not_speak() -> None:
    assert await warm_up({}, ResponseRewriter(AddressMap("h", 1000))) == 0
