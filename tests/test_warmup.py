"""Start-up compilation of the codecs clients will pick."""

from __future__ import annotations

from kproxy.protocol import scan
from kproxy.protocol.codes import ApiKey, all_api_keys
from kproxy.protocol.kinds import FIRST_REQUEST_APIS, warm_up_kinds
from kproxy.protocol.message_schemas import MessageType
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.server.warmup import VERSIONS_BELOW, warm_up

PRODUCE, METADATA = ApiKey.PRODUCE, ApiKey.METADATA


async def test_warm_up_compiles_the_versions_below_the_broker_max() -> None:
    # Versions chosen so that no other test is likely to have compiled these scanners already.
    scan._scanners.clear()
    kinds = await warm_up({PRODUCE: 5, METADATA: 6}, ResponseRewriter(AddressMap("h", 1000)))
    assert kinds == 2 * (VERSIONS_BELOW + 1)
    for api_key, top in ((PRODUCE, 5), (METADATA, 6)):
        for version in range(top - VERSIONS_BELOW, top + 1):
            for direction in (MessageType.REQUEST, MessageType.RESPONSE):
                assert (api_key, version, direction, True) in scan._scanners
    assert (PRODUCE, 6, MessageType.REQUEST, True) not in scan._scanners  # above what the broker speaks
    # The values mode of the answers consumer lag reads (on by default): Metadata's, for its topic ids;
    # Produce's, for its base offsets (the log end offsets); none for a Produce request.
    assert (METADATA, 6, MessageType.RESPONSE, True, True) in scan._scanners
    assert (PRODUCE, 5, MessageType.RESPONSE, True, True) in scan._scanners
    assert not any(key[:3] == (PRODUCE, 5, MessageType.REQUEST) and len(key) == 5 for key in scan._scanners)


async def test_warm_up_skips_apis_the_broker_does_not_speak() -> None:
    assert await warm_up({}, ResponseRewriter(AddressMap("h", 1000))) == 0


def test_the_kinds_to_warm_come_from_the_schemas() -> None:
    broker = {key: 100 for key in all_api_keys()}  # a broker speaking every version of every api
    apis = {api for api, _ in warm_up_kinds(broker)}
    assert apis >= FIRST_REQUEST_APIS
    # Responses with broker endpoints are rewritten, so they are warmed too, found in the schemas:
    assert {ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER, ApiKey.SHARE_FETCH} <= apis
    assert ApiKey.SHARE_FETCH not in FIRST_REQUEST_APIS
    assert ApiKey.DELETE_TOPICS not in apis  # neither a first request nor an endpoint carrier
    assert warm_up_kinds({ApiKey.METADATA: 6}, versions_below=2) == [(3, 6), (3, 5), (3, 4)]
