"""Shared fixtures: a real Tansu broker and a kproxy in front of it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.captured import CapturedRun, make_capture
from tests.support.proxy import ProxyThread, running_proxy
from tests.support.tansu import Broker, run_tansu


@pytest.fixture(scope="session")
def tansu() -> Iterator[Broker]:
    """One Tansu broker for the whole test session (topics are named per test)."""
    with run_tansu() as broker:
        yield broker


@pytest.fixture
def kproxy(tansu: Broker) -> Iterator[ProxyThread]:
    """A fresh kproxy in front of the session's Tansu broker."""
    with running_proxy(tansu.bootstrap) as proxy:
        yield proxy


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
