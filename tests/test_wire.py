"""kproxy.protocol.primitives: varints and tagged-field sections, canonical both ways."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kproxy.protocol.errors import DecodeError, ProtocolError
from kproxy.protocol.primitives import (
    Malformed,
    read_tagged_fields,
    read_uvarint,
    read_varint,
    read_varlong,
    skip_tagged_fields,
    uvarint_bytes,
    write_tagged_fields,
    write_varint,
    write_varlong,
)


def test_malformed_is_one_of_the_codec_errors() -> None:
    assert issubclass(Malformed, DecodeError) and issubclass(Malformed, ProtocolError)
    with pytest.raises(ProtocolError):
        read_uvarint(b"\x80\x00", 0)


@given(st.integers(0, 2**32 - 1))
def test_uvarint_round_trip(n: int) -> None:
    data = uvarint_bytes(n) + b"\xff"
    assert read_uvarint(data, 0) == (n, len(data) - 1)


@given(st.integers(-(2**31), 2**31 - 1))
def test_varint_round_trip(n: int) -> None:
    out = bytearray()
    write_varint(out, n)
    assert read_varint(bytes(out), 0) == (n, len(out))


@given(st.integers(-(2**63), 2**63 - 1))
def test_varlong_round_trip(n: int) -> None:
    out = bytearray()
    write_varlong(out, n)
    assert read_varlong(bytes(out), 0) == (n, len(out))


@pytest.mark.parametrize(("data", "reason"), [
    (b"\x80\x80\x80\x80\x80\x01", "longer than 5 bytes"),
    (b"\xff\xff\xff\xff\x1f", "above 32 bits"),
    (b"\x81\x00", "shortest form"),
])
def test_uvarint_rejects_what_would_not_re_encode(data: bytes, reason: str) -> None:
    with pytest.raises(Malformed, match=reason):
        read_uvarint(data, 0)


def test_varint_rejects_values_above_32_bits() -> None:
    out = bytearray()
    write_varlong(out, 2**33)  # zig-zag 2**34: five bytes, 35 bits
    with pytest.raises(Malformed, match="above 32 bits"):
        read_varint(bytes(out), 0)
    assert read_varlong(bytes(out), 0)[0] == 2**33


@given(st.dictionaries(st.integers(0, 2**20), st.binary(max_size=40), max_size=6))
def test_tagged_fields_round_trip_and_skip(tags: dict[int, bytes]) -> None:
    out = bytearray(b"\x07")  # a byte before, so positions are not all from 0
    write_tagged_fields(out, tags)
    out += b"\x09"
    data = bytes(out)
    assert read_tagged_fields(data, 1) == (tags, len(data) - 1)
    assert skip_tagged_fields(data, 1) == len(data) - 1


def test_tagged_fields_out_of_order_or_past_the_end() -> None:
    with pytest.raises(Malformed, match="out of order"):
        read_tagged_fields(b"\x02\x01\x00\x01\x00", 0)
    with pytest.raises(Malformed, match="past the end"):
        read_tagged_fields(b"\x01\x00\x05ab", 0)
    with pytest.raises(Malformed, match="past the end"):
        skip_tagged_fields(b"\x01\x00\x05ab", 0)
