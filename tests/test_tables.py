"""The committed protocol tables are what the generator makes of Kafka's specs; lookups never raise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.protocol import _tables, api_keys
from kproxy.protocol.codes import (
    RETRIABLE_ERRORS,
    ApiKey,
    ErrorCode,
    api_key,
    api_name,
    api_snake_name,
    error,
    error_code,
    error_name,
)

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT.parent / "shared" / "kafka-specs"


@pytest.mark.skipif(not SPECS.is_dir(), reason="Kafka's JSON specs (../shared/kafka-specs) are not beside the checkout")
def test_committed_tables_match_the_specs() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_protocol_tables.py"), str(SPECS), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_api_key_of_the_specs_has_a_name_and_known_errors_have_flags() -> None:
    assert api_name(0) == "Produce" and api_name(3) == "Metadata" and api_name(18) == "ApiVersions"
    assert api_snake_name(10) == "find_coordinator"
    assert api_key("FindCoordinator") == api_key("find_coordinator") == 10
    assert len(_tables.API_NAMES) >= 80
    assert error(6).name == "NOT_LEADER_OR_FOLLOWER" and error(6).retriable
    assert not error(-1).retriable
    assert error_code("unknown_topic_or_partition") == 3


def test_unknown_values_are_printable_not_exceptions() -> None:
    assert api_name(31000) == "UnknownApi31000"
    assert api_key("NoSuchApi") is None
    assert error_name(31000) == "UNKNOWN_ERROR_CODE_31000"
    assert error(31000).known is False
    assert error_code("NO_SUCH_ERROR") is None



def test_the_enums_name_every_api_key_and_error_code_of_the_tables() -> None:
    assert sorted(ApiKey) == sorted(_tables.API_NAMES)
    assert all(api_name(key).lower() == key.name.replace("_", "").lower() for key in ApiKey)
    assert (ApiKey.PRODUCE, ApiKey.METADATA, ApiKey.API_VERSIONS, ApiKey.DESCRIBE_CLUSTER) == (0, 3, 18, 60)
    assert sorted(ErrorCode) == sorted(_tables.ERRORS)
    assert all(error(code).name == code.name and error(code).retriable == code.retriable for code in ErrorCode)
    assert ErrorCode.UNSUPPORTED_VERSION == 35 and not ErrorCode.UNSUPPORTED_VERSION.retriable
    assert ErrorCode.NOT_LEADER_OR_FOLLOWER.retriable and ErrorCode.NOT_LEADER_OR_FOLLOWER in RETRIABLE_ERRORS
    assert {code for code in ErrorCode if code.retriable} == RETRIABLE_ERRORS


def test_the_api_key_constants_are_the_enum_as_plain_ints() -> None:
    constants = {name: value for name, value in vars(api_keys).items() if name.isupper()}
    assert constants == {member.name: int(member) for member in ApiKey}
    assert all(type(value) is int for value in constants.values())


# Modules another change is taking apart (the session's login gate and terminate mode, issue 38 item 1):
# they move to the constants there.
_REBINDING_LEFT: set[str] = set()


def test_api_keys_are_compared_as_the_constants_not_rebound_per_module() -> None:
    sources = {path.relative_to(ROOT).as_posix(): path.read_text() for path in (ROOT / "kproxy").rglob("*.py")}
    rebinding = sorted(name for name, text in sources.items() if "int(ApiKey." in text and name not in _REBINDING_LEFT)
    assert rebinding == [], f"import the plain ints of kproxy.protocol.api_keys instead: {rebinding}"
