"""Connection log lines name the client: its client id, and its TLS principal when it has one.

A client chooses its client id (up to 32767 bytes, any UTF-8): whatever it holds, the line
kproxy writes about the connection stays one line whose pairs parse back as they were
logged, in logfmt and in JSON. The logfmt rules are checked on their own first, then
through a real :class:`ProxyServer` in front of the scripted fake broker, with the client
ids sent over a raw socket. The TLS principal is in tests/test_tls.py (real certificates).
"""

from __future__ import annotations

import json
import logging
import struct

import pytest
import trio

from kproxy.logfmt import JsonFormatter, LogfmtFormatter, clip, parse_logfmt, q
from kproxy.protocol.frame_builder import request_frame
from kproxy.proxy.principal import tls_principal
from kproxy.testing import proxy_config, running_server
from tests.support.fakecluster import API_VERSIONS, fake_cluster
from tests.support.kafkaclient import KafkaClient

HOSTILE = {
    "spaces": "my app producer 1",
    "quotes": 'say "hi" \\ and \\" too',
    "pairs": "x event=fake reason=none",
    "newlines": "line one\nts=2020-01-01 level=error event=forged\r\nline three",
    "control": "\x1b[31mred\x1b[0m\x00\x07\t\x7f\U000e0001",
    "unicode_breaks": "a\u2028b\u2029c\x85d\x0be\x0cf\u200bg",
    "printable_unicode": "zürich-生产者-🙂",
    "empty": "",
    "long": "k" * 10 * 1024,
}


def one_line(text: str) -> bool:
    """No line break of any kind Python (and so most log shippers) would split on."""
    return len(text.splitlines()) == 1


# -- logfmt quoting on its own --------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_any_value_stays_one_pair_of_one_line(name: str) -> None:
    value = HOSTILE[name]
    message = f"event=connection_closed client_id={q(value)} reason={q('client closed')}"
    record = logging.LogRecord("kproxy.connection", logging.INFO, __file__, 1, message, None, None)
    line = LogfmtFormatter().format(record)
    assert one_line(line), line
    assert line.isprintable(), "no control character reaches the log: terminal escapes included"
    parsed = parse_logfmt(line)
    assert parsed["client_id"] == value
    assert parsed["event"] == "connection_closed" and parsed["reason"] == "client closed"
    assert "msg" not in parsed
    json_line = JsonFormatter().format(record)
    assert one_line(json_line) and json_line.isprintable(), json_line
    entry = json.loads(json_line)
    assert entry["client_id"] == value and entry["event"] == "connection_closed"


def test_plain_values_are_left_as_they_are() -> None:
    assert q("producer-1") == "producer-1"
    assert q("a\\b") == "a\\b"
    assert q("") == '""'
    assert q("a b") == '"a b"'
    assert q("zürich") == "zürich"


def test_a_long_value_is_cut_and_says_how_long_it_was() -> None:
    assert clip("k" * 256) == "k" * 256
    assert clip("k" * 10240) == "k" * 256 + "...[10240 chars]"


# -- through a running proxy ---------------------------------------------------------------------
async def closed_line(client_id: str | None, caplog: pytest.LogCaptureFixture, *, requests: int = 1) -> str:
    """The connection_closed line (logfmt) of one connection that sent ``requests`` ApiVersions
    requests with ``client_id`` in their header (None: a null client id)."""
    caplog.set_level(logging.INFO, logger="kproxy")
    async with fake_cluster((0,)) as cluster, running_server(proxy_config(cluster.bootstrap)) as server:
        caplog.clear()
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            for correlation_id in range(1, requests + 1):
                await client.send_raw(request_frame(API_VERSIONS, 3, correlation_id, client_id=client_id,
                                                    client_software_name="t", client_software_version="1"))
                frame = await client.receive_frame()
                assert struct.unpack_from(">i", frame)[0] == correlation_id

        def closes() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage().startswith("event=connection_closed")]

        with trio.fail_after(5):
            while not closes():
                await trio.sleep(0.01)
    [record] = closes()
    return LogfmtFormatter().format(record)


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_the_close_line_names_the_client_id_whatever_it_holds(name: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    line = await closed_line(HOSTILE[name], caplog)
    assert one_line(line), line
    assert line.isprintable(), line
    parsed = parse_logfmt(line)
    assert parsed["client_id"] == clip(HOSTILE[name])
    assert parsed["event"] == "connection_closed" and parsed["requests"] == "1"
    assert parsed["reason"] == "client closed"
    assert "principal" not in parsed  # plaintext: no identity beyond the client id
    assert len(line) < 1000  # 10 KB of client id cost 256 characters and a length


async def test_the_first_requests_client_id_is_the_connections(caplog: pytest.LogCaptureFixture) -> None:
    line = await closed_line("producer-1", caplog, requests=3)
    assert " client_id=producer-1 " in line


async def test_no_client_id_no_pair(caplog: pytest.LogCaptureFixture) -> None:
    """A null client id, and a connection closed before its first request, log no client_id."""
    assert "client_id=" not in await closed_line(None, caplog)
    assert "client_id=" not in await closed_line(None, caplog, requests=0)


# -- the TLS principal's form -----------------------------------------------------------------------
def test_principal_is_the_subject_as_rfc_2253_writes_it() -> None:
    """Last RDN first, short keywords, special characters escaped, a multi-valued RDN joined by '+'."""
    cert = {"subject": ((("countryName", "US"),), (("organizationName", "Acme, Inc."),),
                        (("organizationalUnitName", "a+b"), ("userId", "7")),
                        (("commonName", " #lead; <x> \"q\" back\\slash "),), (("emailAddress", "a@b.c"),))}
    assert tls_principal(cert) == ('User:emailAddress=a@b.c,CN=\\ #lead\\; \\<x\\> \\"q\\" back\\\\slash\\ ,'
                                   'OU=a\\+b+UID=7,O=Acme\\, Inc.,C=US')
    assert tls_principal({"subject": ((("commonName", "#x"),),)}) == "User:CN=\\#x"


def test_no_verified_certificate_no_principal() -> None:
    assert tls_principal(None) is None
    assert tls_principal({}) is None  # CERT_OPTIONAL and the client sent none
    assert tls_principal({"subject": ()}) is None
