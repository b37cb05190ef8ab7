"""Shared fixtures: a real Tansu broker, a kproxy in front of it, and the pytest plugin's kproxy over that broker."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.testing import Broker, ProxyThread, run_tansu, running_proxy
from kproxy.testing.fixture import KproxyProcess
from tests.support.captured import CapturedRun, make_capture


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``broker`` every test that reaches the real Tansu broker (through :func:`tansu`, directly
    or by a fixture built on it), so ``pytest -m "not broker"`` runs the fast suite."""
    for item in items:
        if "tansu" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.broker)


@pytest.fixture(scope="session")
def tansu() -> Iterator[Broker]:
    """One Tansu broker for the whole test session (topics are named per test)."""
    with run_tansu() as broker:
        yield broker


@pytest.fixture
def proxy(tansu: Broker) -> Iterator[ProxyThread]:
    """A fresh kproxy in front of the session's Tansu broker. (``kproxy`` is the name of the pytest
    plugin's fixture, kproxy/testing/pytest_plugin.py, which tests here use as users do.)"""
    with running_proxy(tansu.bootstrap) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def kproxy_process(tansu: Broker) -> Iterator[KproxyProcess]:
    """The pytest plugin's session kproxy, in front of the session's Tansu broker rather than an
    embedded one of its own: the plugin's ``kproxy`` fixture (one test's rules) runs over it."""
    process = KproxyProcess(tansu.bootstrap)
    try:
        yield process
    finally:
        process.close()


@pytest.fixture(scope="session")
def captured_run(tansu: Broker, tmp_path_factory: pytest.TempPathFactory) -> CapturedRun:
    """One real capture (see :mod:`tests.support.captured`), shared by capture and analysis tests."""
    pytest.importorskip("pyarrow")
    return make_capture(tansu, tmp_path_factory.mktemp("capture"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One Spark session (local[2]) for every analysis test: a JVM start costs seconds."""
    pytest.importorskip("pyspark")
    if not os.environ.get("JAVA_HOME"):
        java = shutil.which("java")
        if java is None:
            pytest.skip("no Java on this machine (Spark needs Java 17+)")
        os.environ["JAVA_HOME"] = str(Path(java).resolve().parent.parent)
    from kproxy.analysis.job import spark_session

    session = spark_session("local[2]")
    session.sparkContext.setLogLevel("ERROR")
    session.conf.set("spark.sql.shuffle.partitions", "2")  # test data is tiny: fewer tasks, faster stages
    yield session
    session.stop()
