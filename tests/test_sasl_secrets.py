"""kproxy/sasl/secret_file.py: the upstream login's secret file, re-read when it changes (in place, or
a Kubernetes Secret's symlink swap); a bad or missing file keeps the last good secret and says so
once, never with the secret in the line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kproxy.logfmt import q
from kproxy.sasl.secret_file import SecretFile, UpstreamCredentials
from tests.support.k8s_secret import kubernetes_secret, swap


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kproxy.sasl"]


def test_a_kubernetes_secret_rotation_is_read_at_the_next_login(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy.sasl")
    path = kubernetes_secret(tmp_path / "secret", "first-pw")
    secret = SecretFile(path, "sasl.upstream.password_file")
    assert secret.current() == "first-pw"
    swap(tmp_path / "secret", "second-pw", "..2024_01_02_00_00_00.1")
    assert secret.current() == "second-pw"
    assert secret.current() == "second-pw"
    assert lines(caplog) == [f"event=sasl_secret_reloaded option=sasl.upstream.password_file file={q(str(path))}"]


def test_an_edit_in_place_is_read_too(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("one\n")
    secret = SecretFile(path, "sasl.upstream.password_file")
    path.write_text("two\n")
    assert secret.current() == "two"


def test_a_bad_or_missing_file_keeps_the_last_secret_and_says_so_once(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy.sasl")
    path = tmp_path / "password"
    path.write_text("good-secret\n")
    secret = SecretFile(path, "sasl.upstream.password_file")
    path.unlink()
    for _ in range(3):
        assert secret.current() == "good-secret"
    path.write_text("")
    for _ in range(3):
        assert secret.current() == "good-secret"
    path.write_bytes(b"\xff\xfe")
    assert secret.current() == "good-secret"
    path.write_text("better-secret")
    assert secret.current() == "better-secret"
    found = lines(caplog)
    assert found == [
        f'event=sasl_secret_unreadable option=sasl.upstream.password_file action=kept_previous '
        f'detail="cannot read {path}: No such file or directory"',
        f'event=sasl_secret_unreadable option=sasl.upstream.password_file action=kept_previous '
        f'detail="{path} is empty"',
        f'event=sasl_secret_unreadable option=sasl.upstream.password_file action=kept_previous '
        f'detail="{path} is not UTF-8 text"',
        f"event=sasl_secret_reloaded option=sasl.upstream.password_file file={q(str(path))}"]
    assert not any(value in line for line in found for value in ("good-secret", "better-secret"))


def test_a_token_file_gives_oauthbearer_credentials(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.\n")
    credentials = UpstreamCredentials("OAUTHBEARER", None, path).current()
    assert (credentials.mechanism, credentials.username, credentials.secret) == (
        "OAUTHBEARER", None, "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.")
    assert "eyJ" not in repr(credentials)
