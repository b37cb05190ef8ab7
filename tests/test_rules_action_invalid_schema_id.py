"""The ``invalid_schema_id`` action (kproxy/rules/actions/invalid_schema_id.py) through its
interface: its reader and its edit of the schema ids of real Produce frames (Confluent wire-format
values only, in the partitions its rule selects). The edit itself: tests/test_protocol_mutations.py."""

from __future__ import annotations

import struct

import pytest

from kproxy.protocol.records import Record, decode_all, encode_batch_v2
from kproxy.rules import RulesError, load_text
from kproxy.rules.actions.invalid_schema_id import InvalidSchemaId
from kproxy.rules.apply import apply_to_request
from tests.test_protocol_mutations import produce_request, records_of
from tests.test_rules_apply import PRODUCE, actions

WIRE_FORMAT = b"\0" + struct.pack(">i", 7) + b"avro"  # magic byte 0, schema id 7, the payload


def test_invalid_schema_id_rewrites_wire_format_values_and_leaves_others() -> None:
    batch = encode_batch_v2([Record(0, 1, b"k", WIRE_FORMAT, []), Record(1, 1, b"k", b"plain", [])])
    acts = actions("- invalid_schema_id: {schema_id: 5}", "{api: produce}")
    assert acts == (InvalidSchemaId(5),)
    out = apply_to_request(acts, produce_request(9, batch))
    for records in records_of(PRODUCE, 9, out.frame):  # both partitions of the request
        assert [r.value for r in decode_all(records)] == [b"\0" + struct.pack(">i", 5) + b"avro", b"plain"]
    assert out.notes[0].startswith("invalid_schema_id 5")


def test_the_default_id_is_the_largest_int32_and_a_larger_one_is_refused() -> None:
    assert actions("- invalid_schema_id", "{api: produce}") == (InvalidSchemaId(2**31 - 1),)
    with pytest.raises(RulesError) as bad:
        load_text("rules:\n  - id: r\n    match: {api: produce}\n    actions:\n"
                  "      - invalid_schema_id: {schema_id: 2147483648}\n", "s.yaml")
    (problem,) = bad.value.problems
    assert str(problem).startswith("s.yaml:5: rules[0].actions[0].invalid_schema_id.schema_id: ")
