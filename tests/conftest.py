"""Shared fixtures: a real Tansu broker and a kproxy in front of it."""

from __future__ import annotations

from collections.abc import Iterator

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
