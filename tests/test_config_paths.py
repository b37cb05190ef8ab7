"""``kproxy run --check`` checks the paths kproxy will write (kproxy/paths.py), and a start that
fails on one names the option, not a listener."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kproxy.paths import path_problems, writable_dir_problem
from kproxy.testing import free_port, proxy_config

KPROXY = [sys.executable, "-m", "kproxy"]
UPSTREAM = "127.0.0.1:9092"  # never reached: every case here stops before connecting


def run_kproxy(*argv: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KPROXY_")}
    return subprocess.run([*KPROXY, *argv], capture_output=True, text=True, timeout=60, env=clean, check=False)


def test_check_refuses_a_capture_dir_it_cannot_create_naming_the_option() -> None:
    """A capture directory that cannot be made (/proc/nope) fails ``--check`` and the run alike,
    both naming ``capture.dir`` and exiting 2 (not ``start_failed listener=bootstrap``)."""
    expected = "kproxy run: invalid configuration: capture.dir: cannot create /proc/nope: No such file or directory"
    checked = run_kproxy("run", "--check", "--upstream", UPSTREAM, "--capture-dir", "/proc/nope")
    assert checked.returncode == 2, checked
    assert "configuration ok" not in checked.stdout
    assert checked.stderr.strip() == expected
    ran = run_kproxy("run", "--upstream", UPSTREAM, "--listen", f"127.0.0.1:{free_port()}",
                     "--capture-dir", "/proc/nope")
    assert ran.returncode == 2, ran
    assert ran.stderr.strip() == expected
    assert "listener=bootstrap" not in ran.stderr


def test_capture_dirs_under_a_file_or_on_a_file_are_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert writable_dir_problem(a_file) == f"{a_file} is not a directory"
    assert writable_dir_problem(a_file / "sub" / "dir") == f"cannot create {a_file / 'sub' / 'dir'}: " \
                                                           f"{a_file} is not a directory"
    checked = run_kproxy("run", "--check", "--upstream", UPSTREAM, "--capture-dir", str(a_file / "sub"))
    assert checked.returncode == 2
    assert f"capture.dir: cannot create {a_file / 'sub'}: {a_file} is not a directory" in checked.stderr


def test_a_creatable_capture_dir_passes_and_the_check_leaves_nothing_behind(tmp_path: Path) -> None:
    new = tmp_path / "new" / "capture"
    checked = run_kproxy("run", "--check", "--upstream", UPSTREAM, "--capture-dir", str(new))
    assert checked.returncode == 0, checked.stderr
    assert "configuration ok" in checked.stdout
    assert list(tmp_path.iterdir()) == [], "the check created a directory and left it"
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "capture-old.parquet").write_text("kept")
    assert path_problems(proxy_config(UPSTREAM, capture__dir=str(existing))) == []
    assert [p.name for p in existing.iterdir()] == ["capture-old.parquet"], "the probe file was left"
    assert path_problems(proxy_config(UPSTREAM)) == []  # no capture: nothing to check


def test_the_paths_kproxy_reads_are_refused_by_check_naming_the_option(tmp_path: Path) -> None:
    """Rules (read through kproxy/rules/reading.py), the admin token file and TLS files: read while
    loading the configuration, so ``--check`` refuses them too, each naming its option."""
    missing = tmp_path / "missing"
    for argv, named in ((["--rules", str(missing)], f"--rules: {missing}:0: (file): cannot read"),
                        (["--admin-listen", "127.0.0.1:0", "--admin-token-file", str(missing)],
                         "--admin-token-file"),
                        (["--tls-client-cert", str(missing), "--tls-client-key", str(missing)],
                         "--tls-client-cert: file")):
        checked = run_kproxy("run", "--check", "--upstream", UPSTREAM, *argv)
        assert checked.returncode == 2, (argv, checked)
        assert named in checked.stderr, (argv, checked.stderr)


def test_a_capture_dir_failing_at_start_is_named_in_the_start_failure() -> None:
    """Past the check (the disk changed since, or an embedding that skips the CLI), the server's own
    start failure names ``capture.dir`` and its path, exit 1: not ``listener=bootstrap``."""
    code = ("from kproxy.server.app import run\nfrom kproxy.testing import proxy_config\n"
            f"raise SystemExit(run(proxy_config({UPSTREAM!r}, listen='127.0.0.1:{free_port()}', "
            "capture__dir='/proc/nope')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done
    assert "event=start_failed option=capture.dir path=/proc/nope error=\"No such file or directory\"" in done.stderr
    assert "listener=bootstrap" not in done.stderr
