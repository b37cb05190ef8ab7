"""Kafka's api keys and error codes: the enums, and printable lookups that never raise.

:class:`ApiKey` and :class:`ErrorCode` (generated into ``_tables.py`` by
scripts/gen_protocol_tables.py) name the constants once; :data:`RETRIABLE_ERRORS`
holds the codes Kafka marks retriable (``ErrorCode.X.retriable`` says it per code).
Code on the per-frame path compares api keys with the plain ints of :mod:`.api_keys`
(generated with the enums), not with ``ApiKey`` members: an ``int == IntEnum`` comparison
goes through the enum's ``__eq__``.

Unknown values are data (a newer broker may send codes this build does not
know): they get a placeholder name, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kproxy.protocol import _tables
from kproxy.protocol._tables import ApiKey, ErrorCode

__all__ = [
    "DEPRECATED_VERSIONS",
    "ERROR_CLASSES",
    "RETRIABLE_ERRORS",
    "ROUTINE_ERRORS",
    "ApiKey",
    "ErrorCode",
    "KafkaError",
    "all_api_keys",
    "api_key",
    "api_name",
    "api_snake_name",
    "error",
    "error_class",
    "error_code",
    "error_name",
]

RETRIABLE_ERRORS: frozenset[int] = _tables.RETRIABLE
# Api key -> (first, last) request version Kafka's specs mark deprecated (KIP-896's list).
DEPRECATED_VERSIONS: dict[int, tuple[int, int]] = _tables.DEPRECATED_VERSIONS


@dataclass(frozen=True, slots=True)
class KafkaError:
    code: int
    name: str
    retriable: bool
    known: bool


def error(code: int) -> KafkaError:
    """The error for a code; unknown codes are ``UNKNOWN_ERROR_CODE_<n>``, not retriable."""
    found = _tables.ERRORS.get(code)
    if found is None:
        return KafkaError(code, f"UNKNOWN_ERROR_CODE_{code}", False, False)
    return KafkaError(code, found[0], found[1], True)


def error_name(code: int) -> str:
    return error(code).name


_BY_NAME = {name: code for code, (name, _) in _tables.ERRORS.items()}


def error_code(name: str) -> int | None:
    """The code of an error name (``NOT_LEADER_OR_FOLLOWER``), case-insensitive; None if unknown."""
    return _BY_NAME.get(name.upper())


# Codes a healthy cluster returns as part of normal protocol flow: counting them as failures
# would make a busy consumer group look broken.
#   MEMBER_ID_REQUIRED: the first JoinGroup of every member (KIP-394).
#   REBALANCE_IN_PROGRESS: how the coordinator tells members to rejoin (Heartbeat, OffsetCommit).
#   FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH: an evicted incremental fetch session;
#   the client starts a new one (KIP-227).
ROUTINE_ERRORS: frozenset[int] = frozenset({
    ErrorCode.MEMBER_ID_REQUIRED, ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
    ErrorCode.INVALID_FETCH_SESSION_EPOCH})
# The kinds of error codes, mildest first (metrics and dashboards tell them apart).
ERROR_CLASSES = ("routine", "retriable", "error")


def error_class(code: int) -> str:
    """``routine`` (normal protocol flow, :data:`ROUTINE_ERRORS`), ``retriable`` (Kafka's own
    retriable flag: the client retries by itself) or ``error``; unknown codes are errors."""
    if code in ROUTINE_ERRORS:
        return "routine"
    return "retriable" if error(code).retriable else "error"


def api_name(api_key: int) -> str:
    """Kafka's name (``Metadata``); unknown keys are ``UnknownApi<n>``."""
    return _tables.API_NAMES.get(api_key, f"UnknownApi{api_key}")


def api_snake_name(api_key: int) -> str:
    """``metadata``, ``find_coordinator``: the label form used in metrics and rules."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", api_name(api_key)).lower()


_BY_API_NAME = {name.lower(): key for key, name in _tables.API_NAMES.items()}
_BY_API_NAME.update({api_snake_name(key): key for key in _tables.API_NAMES})


def api_key(name: str) -> int | None:
    """The key of an api name in either form (``FindCoordinator`` / ``find_coordinator``)."""
    return _BY_API_NAME.get(name.lower())


def all_api_keys() -> list[int]:
    return sorted(_tables.API_NAMES)
