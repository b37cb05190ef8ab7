"""Which message kinds (api key, version) matter to a proxy, derived from the schemas.

* :func:`rewritten_api_keys`: the APIs with a response version that carries broker
  endpoints (found by :mod:`kproxy.protocol.endpoints`), which a proxy must rewrite to
  its own addresses. Read from the schemas, so an API that gains endpoints in a new
  spec is rewritten without a list to update.
* :func:`warm_up_kinds`: the kinds to compile before the first client asks, given the
  versions the broker speaks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from kproxy.protocol.codes import ApiKey, all_api_keys
from kproxy.protocol.endpoints import endpoint_fields
from kproxy.protocol.message_schemas import supported_versions

# The APIs every producer, consumer and admin client sends in its first seconds (bootstrap,
# produce, consume in a group, commit, create topics): what a new client's first requests need.
FIRST_REQUEST_APIS: frozenset[int] = frozenset({
    ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA, ApiKey.OFFSET_COMMIT,
    ApiKey.OFFSET_FETCH, ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP,
    ApiKey.SYNC_GROUP, ApiKey.API_VERSIONS, ApiKey.CREATE_TOPICS, ApiKey.INIT_PRODUCER_ID,
    ApiKey.DESCRIBE_CONFIGS, ApiKey.DESCRIBE_CLUSTER,
})
# Clients older than the broker pick lower versions than the highest both sides speak
# (librdkafka 2.16 asks ApiVersions v3 and Produce v10 of a broker speaking v4 and v11).
VERSIONS_BELOW = 4


@functools.cache
def rewritten_api_keys() -> frozenset[int]:
    """API keys with endpoints in some response version."""
    out = set()
    for key in all_api_keys():
        span = supported_versions(key)
        if span and any(endpoint_fields(key, v) is not None for v in range(span[0], span[1] + 1)):
            out.add(key)
    return frozenset(out)


def warm_up_kinds(broker_versions: Mapping[int, int], versions_below: int = VERSIONS_BELOW
                  ) -> list[tuple[int, int]]:
    """The (api key, version) kinds to compile ahead, most likely first within each api.

    The APIs of :data:`FIRST_REQUEST_APIS` and those whose responses are rewritten
    (:func:`rewritten_api_keys`), that both kproxy and the broker speak
    (``broker_versions``: api key -> the broker's highest version); for each, the
    version clients pick against this broker (the highest both speak) and the
    ``versions_below`` under it that older clients pick.
    """
    kinds = []
    for api_key in sorted(FIRST_REQUEST_APIS | rewritten_api_keys()):
        ours = supported_versions(api_key)
        theirs = broker_versions.get(api_key)
        if ours is None or theirs is None:
            continue
        top = min(ours[1], theirs)
        kinds += [(api_key, version) for version in range(top, max(ours[0], top - versions_below) - 1, -1)]
    return kinds
