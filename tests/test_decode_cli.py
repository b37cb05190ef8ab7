"""``kproxy decode``: hex and raw input, framing detection, request/response matching, errors.

Most tests call :func:`kproxy.cli.main` in-process (capsys); a few run the
installed ``kproxy`` console script and ``python -m kproxy`` as subprocesses.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kproxy.cli import build_parser, main
from kproxy.protocol import RequestHeader, encode_request, frame
from kproxy.protocol.records import Record, encode_batch_v2, encode_message_set
from kproxy.subcommands.decode import DecodeOptions, decode_input
from kproxy.subcommands.hexdump import parse_hex

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "metadata-v0.hex")
Capsys = pytest.CaptureFixture[str]

# Produce v0, correlation id 1, client "foo", acks 1, timeout 1500, topic "test",
# partition 0, one magic-0 message with value "hello world" (the classic protocol guide's example).
PRODUCE_V0 = (
    "00 00 00 4E 00 00 00 00 00 00 00 01 00 03 66 6F 6F 00 01 00 00 05 DC 00 00 00 01 00 04 74 65 73 74 "
    "00 00 00 01 00 00 00 00 00 00 00 25 00 00 00 00 00 00 00 00 00 00 00 19 73 AC F7 7C 00 00 FF FF FF FF "
    "00 00 00 0B 68 65 6C 6C 6F 20 77 6F 72 6C 64"
)
PRODUCE_V0_BYTES = bytes.fromhex(PRODUCE_V0)
RECORDS_AT = 45  # input byte where the Produce frame's records field starts
METADATA_V0_REQUEST = "00000012 0003 0000 00000001 0004 74657374 ffffffff"
METADATA_V0_RESPONSE = "0000000c 00000001 00000000 00000000"

TCPDUMP_X = """\
\t0x0000:  0000 004e 0000 0000 0000 0001 0003 666f  ...N..........fo
\t0x0010:  6f00 0100 0005 dc00 0000 0100 0474 6573  o............tes
\t0x0020:  7400 0000 0100 0000 0000 0000 2500 0000  t...........%...
\t0x0030:  0000 0000 0000 0000 1973 acf7 7c00 00ff  .........s..|...
\t0x0040:  ffff ff00 0000 0b68 656c 6c6f 2077 6f72  .......hello.wor
\t0x0050:  6c64                                     ld
"""

WIRESHARK = """\
0000  00 00 00 4e 00 00 00 00  00 00 00 01 00 03 66 6f   ...N..........fo
0010  6f 00 01 00 00 05 dc 00  00 00 01 00 04 74 65 73   o............tes
0020  74 00 00 00 01 00 00 00  00 00 00 00 25 00 00 00   t...........%...
0030  00 00 00 00 00 00 00 00  19 73 ac f7 7c 00 00 ff   .........s..|...
0040  ff ff ff 00 00 00 0b 68  65 6c 6c 6f 20 77 6f 72   .......hello wor
0050  6c 64                                              ld
"""

HEXDUMP_C = """\
00000000  00 00 00 4e 00 00 00 00  00 00 00 01 00 03 66 6f  |...N..........fo|
00000010  6f 00 01 00 00 05 dc 00  00 00 01 00 04 74 65 73  |o............tes|
00000020  74 00 00 00 01 00 00 00  00 00 00 00 25 00 00 00  |t...........%...|
00000030  00 00 00 00 00 00 00 00  19 73 ac f7 7c 00 00 ff  |.........s..|...|
00000040  ff ff ff 00 00 00 0b 68  65 6c 6c 6f 20 77 6f 72  |.......hello wor|
00000050  6c 64                                             |ld|
00000052
"""


def run(capsys: Capsys, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    """Run ``kproxy decode ARGS``: (exit status, parsed JSON frames, stderr)."""
    status = main(["decode", *args])
    captured = capsys.readouterr()
    frames = [json.loads(line) for line in captured.out.splitlines() if line.strip()]
    return status, frames, captured.err


def write(tmp_path: Path, content: str | bytes, name: str = "input") -> str:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    return str(path)


def assert_produce_v0(frame_json: dict[str, Any], *, with_records: bool) -> None:
    assert frame_json["direction"] == "request"
    assert (frame_json["api_key"], frame_json["api_name"], frame_json["api_version"]) == (0, "produce", 0)
    assert (frame_json["correlation_id"], frame_json["client_id"]) == (1, "foo")
    body = frame_json["body"]
    assert (body["acks"], body["timeout_ms"]) == (1, 1500)
    [topic] = body["topic_data"]
    assert topic["name"] == "test"
    [partition] = topic["partition_data"]
    assert partition["index"] == 0
    [batch] = partition["records"]["batches"]
    assert (batch["magic"], batch["codec"], batch["base_offset"], batch["record_count"]) == (0, "none", 0, 1)
    assert batch["crc"] == "0x73acf77c" and batch["crc_valid"] is True
    if with_records:
        [record] = batch["records"]
        assert record == {"offset": 0, "timestamp": -1, "key": None, "value": "hello world", "headers": []}
    else:
        assert "records" not in batch


# ----------------------------------------------------------------------------- happy paths


def test_produce_v0_golden_with_records(capsys: Capsys, tmp_path: Path) -> None:
    status, frames, err = run(capsys, "--records", write(tmp_path, PRODUCE_V0))
    assert (status, err) == (0, "")
    [only] = frames
    assert (only["frame"], only["byte_offset"], only["size"]) == (0, 0, 78)
    assert_produce_v0(only, with_records=True)


def test_produce_v0_summary_without_records(capsys: Capsys, tmp_path: Path) -> None:
    status, frames, _ = run(capsys, write(tmp_path, PRODUCE_V0_BYTES))
    assert status == 0
    assert_produce_v0(frames[0], with_records=False)


def test_request_then_response_matched_by_correlation_id(capsys: Capsys) -> None:
    status, frames, err = run(capsys, EXAMPLE)
    assert (status, err) == (0, "")
    request, response = frames
    assert request["direction"] == "request" and request["api_name"] == "metadata"
    assert request["client_id"] == "test" and request["body"] == {"topics": None}
    assert response["direction"] == "response" and response["answers"] == 0
    assert (response["api_key"], response["api_version"], response["correlation_id"]) == (3, 0, 1)
    assert response["byte_offset"] == 22
    assert response["body"] == {"brokers": [], "topics": []}


def test_correlation_matching_skips_unrelated_frames(capsys: Capsys, tmp_path: Path) -> None:
    second_request = "00000012 0003 0000 00000002 0004 74657374 ffffffff"
    second_response = "0000000c 00000002 00000000 00000000"
    text = "\n".join([METADATA_V0_REQUEST, second_request, second_response, METADATA_V0_RESPONSE])
    status, frames, _ = run(capsys, write(tmp_path, text))
    assert status == 0
    assert [(f["direction"], f["correlation_id"], f.get("answers")) for f in frames] == [
        ("request", 1, None), ("request", 2, None), ("response", 2, 1), ("response", 1, 0)]


@pytest.mark.parametrize("api_key", ["3", "Metadata", "metadata"])
def test_bare_response_with_api_key_and_version(capsys: Capsys, tmp_path: Path,
                                                api_key: str) -> None:
    path = write(tmp_path, METADATA_V0_RESPONSE)
    status, [response], _ = run(capsys, "--api-key", api_key, "--api-version", "0", path)
    assert status == 0
    assert response["direction"] == "response" and response["answers"] is None
    assert response["api_name"] == "metadata" and response["body"] == {"brokers": [], "topics": []}


def test_forced_direction(capsys: Capsys, tmp_path: Path) -> None:
    path = write(tmp_path, METADATA_V0_RESPONSE)
    flags = ["--direction", "response", "--api-key", "3", "--api-version", "0"]
    status, [response], _ = run(capsys, *flags, path)
    assert status == 0 and response["direction"] == "response"
    status, [request], _ = run(capsys, "--direction", "request", write(tmp_path, METADATA_V0_REQUEST))
    assert status == 0 and request["direction"] == "request"


@pytest.mark.parametrize("dump", [TCPDUMP_X, WIRESHARK, HEXDUMP_C], ids=["tcpdump", "wireshark", "hexdump"])
def test_hex_dumps_with_offset_and_ascii_columns(capsys: Capsys, tmp_path: Path,
                                                 dump: str) -> None:
    status, [only], err = run(capsys, "--records", write(tmp_path, dump))
    assert (status, err) == (0, "")
    assert_produce_v0(only, with_records=True)


def test_other_hex_spellings() -> None:
    expected = PRODUCE_V0_BYTES
    prefixed = " ".join(f"0x{b:02x}" for b in expected)
    assert parse_hex(prefixed).data == expected
    assert parse_hex(", ".join(f"0x{b:02X}" for b in expected)).data == expected
    assert parse_hex(expected.hex()).data == expected  # Wireshark's "hex stream": one word
    assert parse_hex("# a comment\n" + expected.hex(" ", 3).replace(" ", "\n")).data == expected


def test_ascii_column_that_looks_like_hex() -> None:
    # The bytes of "deadbeef": the ASCII column is itself valid hex and must still be dropped.
    assert parse_hex("0x0000:  6465 6164 6265 6566  deadbeef\n").data == b"deadbeef"
    # Without the column the same digits are data.
    assert parse_hex("6465 6164 6265 6566 dead beef").data == b"deadbeef" + bytes.fromhex("deadbeef")


def test_bare_offsets_must_count_bytes() -> None:
    # "0003" is not the number of bytes before it: the first words are data, not an offset column.
    assert parse_hex("0000  0102\n0003  0304\n").data == bytes.fromhex("0000010200030304")
    assert parse_hex("0000  0102\n0002  0304\n").data == bytes.fromhex("01020304")


@pytest.mark.parametrize("flags", [[], ["--no-size"]])
def test_frame_without_size_prefix(capsys: Capsys, tmp_path: Path, flags: list[str]) -> None:
    status, [only], _ = run(capsys, "--records", *flags, write(tmp_path, PRODUCE_V0_BYTES[4:]))
    assert status == 0
    assert only["size"] == 78
    assert_produce_v0(only, with_records=True)


def test_stdin_dash_and_forced_hex(capsys: Capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(METADATA_V0_REQUEST.encode())))
    status, [request], _ = run(capsys, "--hex", "-")
    assert status == 0 and request["api_name"] == "metadata"


def test_forced_raw_reads_text_as_bytes(capsys: Capsys, tmp_path: Path) -> None:
    status, _, err = run(capsys, "--raw", write(tmp_path, METADATA_V0_REQUEST))
    assert status == 2 and "error at byte 0" in err


def test_pretty_output_is_indented(capsys: Capsys, tmp_path: Path) -> None:
    assert main(["decode", "--pretty", write(tmp_path, METADATA_V0_REQUEST)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("{\n  ") and json.loads(out)["api_key"] == 3


def test_v2_batch_records_headers_and_binary_values(capsys: Capsys, tmp_path: Path) -> None:
    records = [Record(7, 1000, b"key", "caf\u00e9".encode(), [("h", b"\x00\xff"), ("n", None)]),
               Record(8, 1002, None, b"\xff\xfe", [])]
    batch = encode_batch_v2(records, base_offset=7, codec=1, producer_id=42, producer_epoch=3)
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 30000,
            "topic_data": [{"name": "t", "partition_data": [{"index": 2, "records": batch}]}]}
    payload = encode_request(RequestHeader(0, 7, 5, "client", 1), body)
    status, [request], _ = run(capsys, "--records", write(tmp_path, frame(payload)))
    assert status == 0
    [summary] = request["body"]["topic_data"][0]["partition_data"][0]["records"]["batches"]
    assert (summary["magic"], summary["codec"], summary["record_count"]) == (2, "gzip", 2)
    assert (summary["base_offset"], summary["last_offset"]) == (7, 8)
    assert (summary["producer_id"], summary["producer_epoch"], summary["transactional"]) == (42, 3, False)
    first, second = summary["records"]
    assert (first["key"], first["value"], first["timestamp"]) == ("key", "caf\u00e9", 1000)
    assert first["headers"] == [{"key": "h", "value": {"hex": "00ff"}}, {"key": "n", "value": None}]
    assert (second["key"], second["value"], second["offset"]) == (None, {"hex": "fffe"}, 8)


def test_legacy_wrapper_counted_without_records(capsys: Capsys, tmp_path: Path) -> None:
    messages = [Record(0, 10, None, b"a", []), Record(1, 11, b"k", b"b", [])]
    wrapper = encode_message_set(messages, magic=1, codec=1)
    body = {"acks": 1, "timeout_ms": 100,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": wrapper}]}]}
    payload = encode_request(RequestHeader(0, 2, 9, None, 1), body)
    status, [request], _ = run(capsys, write(tmp_path, frame(payload)))
    assert status == 0 and request["client_id"] is None
    [summary] = request["body"]["topic_data"][0]["partition_data"][0]["records"]["batches"]
    assert (summary["magic"], summary["codec"], summary["record_count"]) == (1, "gzip", 2)
    assert summary["last_offset"] == 1


def test_bad_crc_is_reported_not_fatal(capsys: Capsys, tmp_path: Path) -> None:
    corrupted = PRODUCE_V0_BYTES[:-1] + b"D"  # "hello worlD"
    status, [request], _ = run(capsys, "--records", write(tmp_path, corrupted))
    assert status == 0
    [batch] = request["body"]["topic_data"][0]["partition_data"][0]["records"]["batches"]
    assert batch["crc_valid"] is False and batch["records"][0]["value"] == "hello worlD"


def test_unknown_api_key_is_data(capsys: Capsys, tmp_path: Path) -> None:
    status, [request], err = run(capsys, write(tmp_path, "0000000c 0063 0000 00000007 0000 abcd"))
    assert (status, err) == (0, "")
    assert (request["api_key"], request["api_version"], request["correlation_id"]) == (99, 0, 7)
    assert request["unknown_api"] is True and "unknown api" in request["note"]
    assert request["body_hex"] == "abcd" and "body" not in request


def test_unknown_api_version_and_its_response(capsys: Capsys, tmp_path: Path) -> None:
    text = "0000000c 0003 0063 00000007 0000 abcd\n00000006 00000007 beef"
    status, [request, response], _ = run(capsys, write(tmp_path, text))
    assert status == 0
    assert request["api_name"] == "metadata" and request["unknown_api"] is True
    assert response["direction"] == "response" and response["answers"] == 0
    assert response["unknown_api"] is True and response["body_hex"] == "beef"


def test_decode_input_is_usable_without_argparse() -> None:
    frames = list(decode_input(PRODUCE_V0_BYTES, DecodeOptions(records=True)))
    assert frames[0]["body"]["acks"] == 1
    with pytest.raises(ValueError, match="go together"):
        DecodeOptions(api_key=3)


# -------------------------------------------------------------------------------- errors

# A Metadata v0 response whose topics[0].name announces 16 bytes where 8 are left.
BAD_METADATA_RESPONSE = "00000016 00000001 00000000 00000001 0000 0010 74657374 00000000"
# The Produce frame with its message's size field (8 bytes into the records) set to 5, below any minimum.
SIZE_AT = RECORDS_AT + 8
CORRUPT_ENTRY = PRODUCE_V0_BYTES[:SIZE_AT] + (5).to_bytes(4, "big") + PRODUCE_V0_BYTES[SIZE_AT + 4 :]


@pytest.mark.parametrize(("content", "flags", "offset", "words"), [
    (PRODUCE_V0_BYTES[:60], [], 0, "truncated frame"),
    ("0000 004e zz", [], 10, "not hex"),
    ("0000 004e abc", [], 10, "odd number of hex digits"),
    ("ffffffff 0003 0000", [], 0, "negative frame size"),
    ("7fffffff 0003 0000", [], 0, "exceeds the limit"),
    (METADATA_V0_RESPONSE, [], 16, "--api-key"),
    (METADATA_V0_RESPONSE, ["--direction", "response"], 4, "--api-key"),
    (BAD_METADATA_RESPONSE, ["--api-key", "3", "--api-version", "0"], 18, "in topics[0].name"),
    ("0000000a 00000001 00000000 0000", ["--api-key", "3", "--api-version", "0"], 12,
     "truncated MetadataResponse v0"),
    (CORRUPT_ENTRY, [], RECORDS_AT + 8, "topic_data[0].partition_data[0].records"),
    (PRODUCE_V0_BYTES + b"\x00\x00", [], 82, "truncated size prefix"),
    ("", [], 0, "empty input"),
    ("  \n", [], 0, "empty input"),
], ids=["truncated-frame", "bad-hex", "odd-hex", "negative-size", "huge-size", "response-without-api-key",
        "forced-response-without-api-key", "bad-string-length", "truncated-body", "corrupt-record-entry",
        "trailing-bytes", "empty", "blank"])
def test_malformed_input_exits_2_with_one_line(capsys: Capsys, tmp_path: Path,
                                               content: str | bytes, flags: list[str], offset: int,
                                               words: str) -> None:
    status, _, err = run(capsys, *flags, write(tmp_path, content))
    assert status == 2
    assert err.count("\n") == 1 and err.endswith("\n")
    assert err.startswith(f"kproxy decode: error at byte {offset}")
    assert words in err and "Traceback" not in err


def test_good_frames_print_before_the_error(capsys: Capsys, tmp_path: Path) -> None:
    text = METADATA_V0_REQUEST + "\n00000012 0003 0000 00000002"
    status, [request], err = run(capsys, write(tmp_path, text))
    assert status == 2 and request["correlation_id"] == 1
    assert err.startswith("kproxy decode: error at byte 22 (hex line 2, column 1): truncated frame")


def test_missing_file(capsys: Capsys, tmp_path: Path) -> None:
    status, _, err = run(capsys, str(tmp_path / "absent"))
    assert status == 2 and err.startswith("kproxy decode: cannot read") and err.count("\n") == 1


@pytest.mark.parametrize("args", [
    ["decode", "--hex", "--raw", "-"],
    ["decode", "--api-key", "3", "-"],
    ["decode", "--api-key", "NoSuchApi", "--api-version", "0", "-"],
    ["decode", "--api-version", "70000", "--api-key", "3", "-"],
    ["decode", "--direction", "sideways", "-"],
    ["decode", "--bogus"],
    [],
])
def test_bad_flags_exit_2_with_usage(capsys: Capsys, args: list[str]) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: kproxy") and "Traceback" not in err


def test_parser_has_subcommands() -> None:
    help_text = build_parser().format_help()
    assert "decode" in help_text and "COMMAND" in help_text


# ---------------------------------------------------------------------------- subprocesses


def console_script() -> Path:
    script = Path(sys.executable).parent / "kproxy"
    assert script.exists(), f"the kproxy console script is not installed next to {sys.executable}"
    return script


def test_console_script_decodes_stdin() -> None:
    proc = subprocess.run([str(console_script()), "decode", "-"], input=PRODUCE_V0.encode(),
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert_produce_v0(json.loads(proc.stdout), with_records=False)


def test_console_script_reports_bad_input_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([str(console_script()), "decode", write(tmp_path, PRODUCE_V0_BYTES[:40])],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("kproxy decode: error at byte 0: truncated frame")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_python_dash_m(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kproxy", "decode", EXAMPLE],
                          capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["direction"] for line in proc.stdout.splitlines()] == ["request", "response"]


# ------------------------------------------------------------------ read as leniently as brokers


def _with_trailing_bytes(request: bytes, extra: bytes) -> bytes:
    """A request frame (size prefix included) with ``extra`` after its body, inside the frame."""
    return (len(request) - 4 + len(extra)).to_bytes(4, "big") + request[4:] + extra


def test_a_request_with_bytes_after_its_body_decodes_and_shows_them(capsys: Capsys, tmp_path: Path) -> None:
    """Real librdkafka was seen sending Metadata v12 with 3 bytes after the body; brokers accept it,
    so kproxy decode reads it as they do and shows the bytes."""
    from kproxy.protocol.frame_builder import request_frame

    metadata = request_frame(3, 12, 5, topics=[{"name": "orders"}], allow_auto_topic_creation=False)
    text = _with_trailing_bytes(metadata, b"\x00\x01\x02").hex()
    status, [out], err = run(capsys, write(tmp_path, text))
    assert status == 0, err
    assert out["direction"] == "request" and out["api_name"] == "metadata" and out["correlation_id"] == 5
    assert out["body"]["topics"][0]["name"] == "orders"
    assert out["trailing_bytes"] == {"byte_offset": len(metadata), "size": 3, "hex": "000102"}


def test_a_response_is_still_preferred_to_a_request_with_trailing_bytes(capsys: Capsys, tmp_path: Path) -> None:
    """A strict request first, then a response its request explains, only then the lenient reading."""
    from kproxy.protocol.frame_builder import request_frame, response_frame

    request = request_frame(3, 12, 9, topics=[{"name": "orders"}])
    answer = response_frame(3, 12, 9, brokers=[], topics=[])
    status, frames, err = run(capsys, write(tmp_path, (request + answer).hex()))
    assert status == 0, err
    assert [f["direction"] for f in frames] == ["request", "response"]
    assert all("trailing_bytes" not in f for f in frames)


def test_api_names_are_spelled_as_the_metrics_spell_them(capsys: Capsys, tmp_path: Path) -> None:
    """One spelling everywhere: ``find_coordinator`` as in ``kproxy_requests_total{api=...}``, rules and logs."""
    from kproxy.protocol.frame_builder import request_frame

    status, frames, _ = run(capsys, write(tmp_path, request_frame(10, 1, 7, key="orders-app", key_type=0)))
    assert status == 0
    assert frames[0]["api_name"] == "find_coordinator"
