"""``sasl.upstream``: kproxy's own login to the brokers, configured like every other option, its
secret only ever in a file; ``kproxy run --check`` reads the file and says what is wrong, one line each."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.config import OPTIONS, ConfigError, SaslUpstream, add_run_arguments, build_config, config_from_args
from kproxy.sasl.secret_file import SECRET_MAX_BYTES, read_secret

KPROXY = [sys.executable, "-m", "kproxy"]
SASL_OPTIONS = {"mechanism", "username", "password_file", "token_file"}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser.parse_args(argv)


def problems(**sasl: object) -> list[str]:
    raw = {"upstream": ("k:1", "test"), **{f"sasl.upstream.{k}": (v, "test") for k, v in sasl.items()}}
    try:
        build_config(raw)
    except ConfigError as exc:
        return list(exc.problems)
    return []


@pytest.fixture
def password(tmp_path: Path) -> Path:
    path = tmp_path / "password"
    path.write_text("s3cret\n")
    return path


def test_the_options_take_every_secret_from_a_file_only() -> None:
    sasl = {o.path.removeprefix("sasl.upstream.") for o in OPTIONS if o.path.startswith("sasl.upstream.")}
    assert sasl == SASL_OPTIONS
    # No option, variable or flag carries a password or a token itself.
    assert not [o.path for o in OPTIONS if o.path.startswith("sasl.") and o.path.endswith(("password", "token"))]


def test_yaml_variable_and_flag_set_the_same_login(tmp_path: Path, password: Path) -> None:
    file = tmp_path / "kproxy.yaml"
    file.write_text(f"upstream: k:1\nsasl:\n  upstream:\n    mechanism: scram-sha-512\n    username: alice\n"
                    f"    password_file: {password}\n")
    from_file = config_from_args(parse(["--config", str(file)]), environ={})
    from_env = config_from_args(parse([]), environ={
        "KPROXY_UPSTREAM": "k:1", "KPROXY_SASL_UPSTREAM_MECHANISM": "SCRAM-SHA-512",
        "KPROXY_SASL_UPSTREAM_USERNAME": "alice", "KPROXY_SASL_UPSTREAM_PASSWORD_FILE": str(password)})
    from_flags = config_from_args(parse(["--upstream", "k:1", "--sasl-upstream-mechanism", "SCRAM-SHA-512",
                                         "--sasl-upstream-username", "alice",
                                         "--sasl-upstream-password-file", str(password)]), environ={})
    assert from_file == from_env == from_flags
    assert from_file.sasl_upstream == SaslUpstream("SCRAM-SHA-512", "alice", password, None)
    assert from_file.sasl_upstream.secret_file == password


def test_a_secret_written_in_the_config_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "kproxy.yaml"
    file.write_text("upstream: k:1\nsasl:\n  upstream:\n    mechanism: PLAIN\n    username: a\n    password: hunter2\n")
    with pytest.raises(ConfigError) as caught:
        config_from_args(parse(["--config", str(file)]), environ={})
    assert any(":6: sasl.upstream.password: unknown key" in p for p in caught.value.problems)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(("given", "expected"), [
    ({"mechanism": "SCRAM-SHA-256"},
     ["test: sasl.upstream.username: required with mechanism SCRAM-SHA-256 (--sasl-upstream-username)",
      "sasl.upstream.password_file: required with mechanism SCRAM-SHA-256 (--sasl-upstream-password-file)"]),
    ({"mechanism": "OAUTHBEARER", "username": "a"},
     ["sasl.upstream.token_file: required with mechanism OAUTHBEARER (--sasl-upstream-token-file)",
      "sasl.upstream.username: not used with mechanism OAUTHBEARER: the token names the principal"]),
    ({"username": "a"}, ["sasl.upstream.username: needs sasl.upstream.mechanism (--sasl-upstream-mechanism)"]),
    ({"mechanism": "GSSAPI"},
     ["test: must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, got 'GSSAPI'"]),
])
def test_options_that_do_not_go_together_are_named_one_line_each(given: dict[str, str], expected: list[str]) -> None:
    found = problems(**given)
    assert len(found) == len(expected), found
    for line, text in zip(found, expected, strict=True):
        assert line.endswith(text.removeprefix("test: ")), (line, text)


def test_a_token_file_with_plain_is_refused(password: Path) -> None:
    assert problems(mechanism="PLAIN", username="a", password_file=str(password), token_file=str(password)) == [
        "sasl.upstream.token_file: not used with mechanism PLAIN: PLAIN logs in with sasl.upstream.password_file"]


@pytest.mark.parametrize(("content", "reason"), [
    (b"", "is empty"),
    (b"\n\r\n", "is empty"),
    (b"\xff\xfe", "is not UTF-8 text"),
    (b"a" * (SECRET_MAX_BYTES + 1), f"more than the {SECRET_MAX_BYTES} a secret may have"),
    (b"pass\x00word", "holds a NUL character"),
])
def test_a_bad_password_file_is_one_line_without_its_text(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "password"
    path.write_bytes(content)
    found = problems(mechanism="PLAIN", username="a", password_file=str(path))
    assert len(found) == 1 and found[0].startswith(f"sasl.upstream.password_file: {path}") and reason in found[0]


def test_secrets_are_read_as_written() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s"
        path.write_bytes(b" pass word \r\n")
        assert read_secret(path) == " pass word "  # a password keeps its spaces, not its line break
        path.write_bytes(b"\n  eyJ.eyJ.  \n")
        assert read_secret(path, token=True) == "eyJ.eyJ."
        path.write_bytes(b"eyJ. eyJ.")
        with pytest.raises(ValueError, match="white space inside the token"):
            read_secret(path, token=True)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KPROXY_")}
    return subprocess.run([*KPROXY, "run", "--check", "--upstream", "127.0.0.1:9", *argv], capture_output=True,
                          text=True, timeout=60, env=clean, check=False)


@pytest.mark.slow
def test_run_check_reads_the_secret_file(tmp_path: Path, password: Path) -> None:
    ok = _run("--sasl-upstream-mechanism", "SCRAM-SHA-256", "--sasl-upstream-username", "alice",
              "--sasl-upstream-password-file", str(password))
    assert ok.returncode == 0 and "configuration ok" in ok.stdout, ok
    empty = tmp_path / "token"
    empty.write_text("  \n")
    bad = _run("--sasl-upstream-mechanism", "OAUTHBEARER", "--sasl-upstream-token-file", str(empty),
               "--sasl-upstream-username", "alice")
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        "kproxy run: invalid configuration: sasl.upstream.username: not used with mechanism OAUTHBEARER: the "
        "token names the principal",
        f"kproxy run: invalid configuration: sasl.upstream.token_file: {empty} is empty"]
    assert "s3cret" not in ok.stdout + ok.stderr + bad.stdout + bad.stderr
