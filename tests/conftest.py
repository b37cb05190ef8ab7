"""Shared fixtures: a real Tansu broker, a kproxy in front of it, and the pytest plugin's kproxy over that broker."""

from __future__ import annotations

import gc
import os
import random
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

from kproxy import native
from kproxy.testing import Broker, ProxyThread, run_tansu, running_proxy
from kproxy.testing.fixture import KproxyProcess
from tests.sasl_front import SaslFront
from tests.support.captured import CapturedRun, make_capture
from tests.support.interpreter_state import StateWatch
from tests.support.matrix import SEED_VARIABLE, matrix_seed
from tests.support.module_times import ModuleTimes, cpu_seconds
from tests.support.thread_cpu import StrayThreads

TESTS = Path(__file__).resolve().parent
# What ``scripts/test --fast`` leaves out besides the broker's tests (marked ``slow``): tests of
# seconds each, by what they start (Spark, kproxy or other programs as subprocesses, real servers,
# Helm renders, the security scanners) or how long they run (fuzzing, big rule sets, slow
# property tests). Paths are relative to tests/; test_suite_marks.py checks each still exists.
SLOW_MODULES = frozenset({
    "fuzz/test_fuzz.py",  # each target fuzzed for seconds
    "plugin/test_pytest_plugin.py",  # a user's suite in pytest processes of its own
    "test_admin_hostile.py",
    "test_bench_smoke.py",  # every benchmark at its smallest size: processes, brokers
    "test_bench_analysis_smoke.py",  # the analysis benchmark's smoke run: a Spark session
    "test_analysis_cluster.py",  # a standalone Spark master and two workers
    "test_analysis_launch.py",  # kproxy analyze as fresh processes, Spark started in each
    "test_bench_publish.py",  # the fixed-rate benchmark's smoke run: brokers, a pipe, kproxy
    "test_capture_metadata_memo.py",
    "test_capture_writer.py",  # disk failures, rotation, caps: real files over seconds
    "test_chart_operations.py",  # Helm renders, Prometheus rule evaluations
    "test_cli_admin.py",  # the kproxy command line as subprocesses
    "test_cli_broker.py",
    "test_cli_run.py",
    "test_codec_crosscheck.py",  # every message kind through kio and kafka-python
    "test_config_operations.py",
    "test_config_paths.py",
    "test_doc_examples.py",  # the docs' shell blocks and servers
    "test_hostile_server.py",
    "test_lag_hostile.py",  # 30,000 requests of 32 KiB through kproxy and Tansu
    "test_hostile_sasl.py",  # floods of PLAIN logins through a kproxy process, at the real hash cost
    "test_image.py",  # the Dockerfile built by buildah, the image run by podman: minutes
    "test_image_health.py",
    "test_install_compiled.py",  # the README's install in a fresh venv: a wheel compiled by mypyc, Spark
    "test_install_fallback.py",  # a wheel built where mypyc fails, installed with its extras
    "test_install_pure.py",  # the README's install with no C compiler, or a failing one
    "test_resilience_memo.py",
    "test_rules_examples_clients.py",  # every example file with real clients: minutes of faults
    "test_rules_heal_clients.py",  # faults that end with their rule, librdkafka and kafkajs (Node) through each
    "test_rules_metadata_clients.py",  # metadata mutations met by librdkafka and kafkajs (Node)
    "test_rules_multibroker.py",
    "test_rules_properties.py",  # property tests of the engine, hundreds of rule sets
    "test_rules_reload_hostile.py",  # FIFOs, /dev/zero, 100,000 rules, kproxy subprocesses
    "test_security_scan.py",  # checkov
    "test_suite_times.py",  # pytest runs of the suite's own modules, as subprocesses
})
# The modules that take longest, longest first (the `longest test modules` table a run prints:
# tests/support/module_times.py). They are scheduled first, the rest after them in the order pytest
# collects them: with each module whole in one worker (``--dist loadfile``), a long module handed out
# last would leave the other cores idle while it runs. scripts/test passes ``--no-loadscope-reorder``,
# since pytest-xdist's own order (most tests first) puts these long modules of few tests last. A module
# missing here only runs later than it could; re-rank from a whole run's table when it has moved.
LONGEST_FIRST: tuple[str, ...] = (
    "test_install_compiled.py", "test_analysis_launch.py", "test_rules_examples_clients.py",
    "test_rules_heal_clients.py", "test_analysis_cluster.py", "test_soak.py", "test_anomalies_e2e.py",
    "test_whatif.py", "fuzz/test_fuzz.py", "test_bench_smoke.py", "test_analysis_anomalies.py",
    "test_install_fallback.py", "test_install_pure.py", "test_rules_metadata_clients.py",
    "test_sasl_terminate_e2e.py", "test_lag_seconds_e2e.py", "test_demo_traffic.py", "test_rules_reload_hostile.py",
    "test_e2e_clients.py", "test_sasl_upstream.py", "test_image.py", "test_bench_analysis_smoke.py",
    "test_analysis.py", "test_analysis_lag_seconds.py", "test_rules_blackhole_e2e.py", "test_codec_roundtrip.py",
    "plugin/test_pytest_plugin.py", "test_doc_examples.py", "test_resilience_clients.py", "test_capture_offsets.py",
    "test_fair_turns.py", "test_rules_e2e.py", "test_rules_client_notes.py", "test_rules_patterns.py",
)
SLOW_TESTS = frozenset({
    "test_codec_roundtrip.py::test_roundtrip",  # generated bodies of every kind and version
    "test_codec_malformed.py::test_fuzz_random_bytes",
    "test_codec_malformed.py::test_fuzz_mutated_valid_bodies",
    # Generated patterns against Python's re, which backtracks: the first takes minutes of CPU.
    "test_rules_patterns.py::test_re2_agrees_with_re_on_the_shared_syntax",
    "test_rules_patterns.py::test_documented_patterns_match_as_re_did",
    "test_rules_patterns.py::test_a_topic_glob_means_what_fnmatch_says",
    # 100,000 topic names and 100,000 connections through Sessions: ~15 s.
    "test_metrics_traffic.py::test_100000_topics_client_ids_and_software_names_leave_metrics_under_1_mb",
})
SLOW_FIXTURES = frozenset({"spark", "captured_run"})
# The pure pass: scripts/test runs the whole suite on the compiled build (pyproject.toml
# [tool.kproxy.native], kproxy/native.py), then the tests of the code that is compiled again with
# KPROXY_PURE=1, so that the pure Python, which is the same code, stays right too. Each test module of
# it names the compiled modules whose code it exercises (directly, or through the compiled module
# that calls them); it is in the pass (marked ``pure_pass``) while one of them is in pyproject.toml's
# list, the one truth of what is compiled: a module no longer compiled takes its tests out of the
# pass, and test_suite_marks.py checks that every compiled module has a test here. Every test marked
# ``pure_only`` (it patches a function inside a compiled module, which compiled callers never look up
# again) is in the pass too: skipped on the compiled build, run in the pure pass.
PURE_PASS_TESTS: dict[str, frozenset[str]] = {test: frozenset(f"kproxy.{m}" for m in tested.split())
                                              for test, tested in {
    "test_session.py": "proxy.session proxy.commands proxy.correlation proxy.release protocol.headers",
    "test_connection_failures.py": "server.connection server.fastio",
    "test_facts_exchange.py": "proxy.exchange rules.frame_facts protocol.request_fields",
    "test_scan_shared.py":
        "protocol.scan protocol.produce_scan protocol.fetch_scan metrics.traffic_observer metrics.traffic "
        "metrics.client_anomalies",
    "test_framing.py": "protocol.framing",
    "test_batch_layout.py": "protocol.records.counting metrics.client_anomalies",
    "test_wire.py": "protocol.primitives",
    "test_codec_golden.py": "protocol.headers",
    "test_codec_malformed.py": "protocol.framing",
    "test_rewrite_memo.py": "proxy.address_rewrite proxy.addresses",
    "test_rewrite_big_bodies.py": "proxy.address_rewrite",
    "test_metrics_counting.py": "metrics.fixed_histogram metrics.stats protocol.records.counting",
    "test_metrics_kinds.py": "metrics.stats",
    "test_metrics_memo.py": "metrics.traffic_observer",
    "test_lag_metrics.py": "metrics.consumer_lag capture.partition_items",
    "test_offsets.py": "protocol.offset_reads",
    "test_anomalies.py": "metrics.retries",
    "test_capture_observer.py":
        "capture.observer capture.record_builder capture.connection_info capture.columns capture.queue",
    "test_capture_rows_kept.py": "capture.record_builder capture.partition_items capture.columns",
    "test_rules_session.py": "policy.policy proxy.session",
    "test_rules_engine.py": "rules.engine",
    "test_rules_properties.py": "rules.engine",
    "test_resilience_memo.py": "proxy.address_rewrite",
    "test_rules_apply.py": "policy.policy rules.engine",
    "test_rules_actions.py": "rules.engine",
    "test_native.py": "proxy.session",  # which build each pass is on: run in both while anything is compiled
}.items()}


def compiled_modules() -> frozenset[str]:
    """The modules pyproject.toml lists to compile ([tool.kproxy.native] modules)."""
    with open(TESTS.parent / "pyproject.toml", "rb") as f:
        return frozenset(tomllib.load(f)["tool"]["kproxy"]["native"]["modules"])


def pure_pass_modules(compiled: frozenset[str]) -> frozenset[str]:
    """The test modules of the pure pass when ``compiled`` are the compiled modules."""
    return frozenset(test for test, tested in PURE_PASS_TESTS.items() if tested & compiled)


PURE_PASS_MODULES = pure_pass_modules(compiled_modules())
LONGEST_RANK = {module: rank for rank, module in enumerate(LONGEST_FIRST)}
# The modules whose tests use the session's Spark or its real capture (the ``spark`` and ``captured_run``
# fixtures, one per worker): they are one unit of work, run by one worker, which starts one JVM and
# makes one capture for all of them instead of each worker its own (``SessionSharing``). The unit is
# handed out first. tests/test_suite_marks.py checks this list against the fixtures the tests use.
SHARED_SESSION_FIXTURES = frozenset({"spark", "captured_run"})
SHARED_SESSION_MODULES = frozenset({
    "test_analysis.py", "test_analysis_anomalies.py", "test_analysis_cluster.py", "test_analysis_clusters.py",
    "test_analysis_interval.py", "test_analysis_lag_seconds.py", "test_analysis_views.py", "test_capture_e2e.py",
    "test_capture_faults.py", "test_capture_offsets.py", "test_rules_principal_e2e.py", "test_whatif.py",
})
SHARED_SESSION_UNIT = "tests/ (the modules sharing the session's Spark and capture)"
# Fixtures that start a Tansu broker of their own (tests/sasl_front.py's front is one, before its Tansu).
BROKER_FIXTURES = frozenset({"tansu", "sasl_front"})


MODULE_TIMES = ModuleTimes()
STRAYS = StrayThreads()
STRAY_PROPERTY = "stray_threads"  # a teardown report's user property: threads busy during it, there before it
STRAY_REPORTS: list[str] = []
STATE = StateWatch()
STATE_PROPERTY = "interpreter_state"  # a teardown report's user property: settings the test left changed
STATE_REPORTS: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--module-times", type=int, default=20, metavar="N",
                     help="print the N test modules that took longest at the end of the run (0: none); "
                          "tests/support/module_times.py")


PHASE_CPU = pytest.StashKey[dict[str, float]]()
CPU_PROPERTY = "cpu_seconds"  # a report's user property: its phase's CPU seconds (tests/support/module_times.py)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    module = item.nodeid.split("::", 1)[0]
    if module != LAST_MODULE[0]:
        LAST_MODULE[0] = module
        _freeze_what_is_alive()
    STRAYS.begin(module)
    STATE.begin()
    return (yield from _phase_cpu(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    return (yield from _phase_cpu(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Any:
    return (yield from _phase_cpu(item, "teardown"))


def _phase_cpu(item: pytest.Item, when: str) -> Any:
    """Run one phase, noting the CPU seconds it cost for its report (below)."""
    before = cpu_seconds()
    try:
        return (yield)
    finally:
        item.stash.setdefault(PHASE_CPU, {})[when] = cpu_seconds() - before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    report.user_properties.append((CPU_PROPERTY, item.stash.get(PHASE_CPU, {}).get(call.when, 0.0)))
    if call.when == "teardown":
        report.user_properties.append((STRAY_PROPERTY, STRAYS.end(item.nodeid.split("::", 1)[0])))
        report.user_properties.append((STATE_PROPERTY, STATE.end()))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    cpu = next((value for key, value in report.user_properties
                if key == CPU_PROPERTY and isinstance(value, float)), 0.0)
    MODULE_TIMES.add(report.nodeid, report.when, report.duration, cpu)
    for key, value in report.user_properties:
        if key == STRAY_PROPERTY and isinstance(value, list) and value:
            STRAY_REPORTS.append(f"{report.nodeid}: {', '.join(map(str, value))}")
        if key == STATE_PROPERTY and isinstance(value, list) and value:
            STATE_REPORTS.append(f"{report.nodeid}: {'; '.join(map(str, value))}")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    count = config.getoption("--module-times")
    lines = MODULE_TIMES.lines(count) if count > 0 else []
    if lines:
        terminalreporter.section("longest test modules (seconds of setup, call and teardown, summed over workers)")
        for line in lines:
            terminalreporter.write_line(line)
    if STRAY_REPORTS:
        terminalreporter.section("threads busy during tests that found them running (tests/support/thread_cpu.py)")
        for line in STRAY_REPORTS[:40]:
            terminalreporter.write_line(line)
    if STATE_REPORTS:
        terminalreporter.section("interpreter settings tests left changed (tests/support/interpreter_state.py)")
        for line in STATE_REPORTS[:40]:
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    """Choose this run's seed of the sampled matrices (tests/support/matrix.py) unless one is given: set
    in the environment before the xdist workers start, so that every worker collects the same tests."""
    if not os.environ.get(SEED_VARIABLE, "").strip():
        os.environ[SEED_VARIABLE] = str(random.SystemRandom().randrange(1_000_000))
    matrix_seed()  # a malformed seed fails here, before any test


def pytest_report_header(config: pytest.Config) -> str:
    return f"sampled matrices: {SEED_VARIABLE}={os.environ[SEED_VARIABLE]} (tests/support/matrix.py)"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Leave what collection built (every test item of the suite, in each xdist worker) out of later
    garbage collections, as ``kproxy run`` does with its own start-up (kproxy.memory): a
    full collection walks all of it, long enough that a kproxy running in a test's process would
    count the pause as its event loop held, and fail a hostile test's bound for the test process's
    heap. Tests that change the collector restore the freeze (tests/test_connection_setup.py)."""
    _freeze_what_is_alive()


LAST_MODULE = [""]  # the module of the test set up last in this process


def _freeze_what_is_alive() -> None:
    """Collect, then leave every object still alive out of later collections. Done after collection
    and again as each module begins (its predecessor's module fixtures are torn down by then): what
    the modules before left alive (session fixtures such as a Spark session, caches, imported
    libraries) would otherwise be walked by each full collection, and a collection in an in-process
    kproxy's thread counts as its loop held."""
    gc.collect()
    gc.freeze()


def may_hold_pure_pass_tests(path: Path) -> bool:
    """Whether the test module at ``path`` can hold a test of the pure pass: it is one of
    PURE_PASS_MODULES, or its text marks a test ``pure_only`` (the marks are read, not imported)."""
    module = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    return module in PURE_PASS_MODULES or "pure_only" in path.read_text()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The pure pass (``-m pure_pass``, alone or first of an ``and``: scripts/test) does not import the
    test modules that cannot hold one of its tests: each worker would import all of them to keep a
    tenth of the tests. tests/test_suite_marks.py checks that no module left out holds one."""
    marks = str(config.getoption("markexpr", "") or "")
    if marks != "pure_pass" and not marks.startswith("pure_pass and "):
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return None if may_hold_pure_pass_tests(collection_path) else True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``broker`` every test that reaches a real Tansu broker (the fixtures of BROKER_FIXTURES,
    directly or by a fixture built on them), and ``slow`` the tests of SLOW_MODULES, SLOW_TESTS and
    those using SLOW_FIXTURES: ``pytest -m "not broker and not slow"`` is the fast suite (``scripts/test --fast``)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & BROKER_FIXTURES:
            item.add_marker(pytest.mark.broker)
        module = item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else ""
        test = f"{module}::{getattr(item, 'originalname', item.name)}"
        if module in SLOW_MODULES or test in SLOW_TESTS or fixtures & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)
        pure_only = item.get_closest_marker("pure_only") is not None
        if module in PURE_PASS_MODULES or pure_only:
            item.add_marker(pytest.mark.pure_pass)
        if pure_only and native.BUILD.compiled:
            item.add_marker(pytest.mark.skip(reason="patches a function of a compiled module: runs in the pure "
                                                    "pass (KPROXY_PURE=1, scripts/test)"))
    items.sort(key=schedule_rank)


def schedule_rank(item: pytest.Item) -> int:
    """Where ``item``'s module goes in the run: first the modules of SHARED_SESSION_MODULES (one unit),
    then its place in LONGEST_FIRST, else after all of them (``list.sort`` is stable, so the rest keep
    the order they were collected in)."""
    module = item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else ""
    return -1 if module in SHARED_SESSION_MODULES else LONGEST_RANK.get(module, len(LONGEST_RANK))


class SessionSharing(LoadFileScheduling):
    """``--dist loadfile`` (each module whole in one worker), with the modules of SHARED_SESSION_MODULES
    as one unit: a worker makes the session fixtures they share once for all of them."""

    def _split_scope(self, nodeid: str) -> str:
        module = super()._split_scope(nodeid)
        return SHARED_SESSION_UNIT if module.removeprefix("tests/") in SHARED_SESSION_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> SessionSharing | None:
    """scripts/test's ``--dist loadfile`` is scheduled by :class:`SessionSharing`; other modes as xdist does."""
    return SessionSharing(config, log) if config.getoption("dist", "no") == "loadfile" else None


@pytest.fixture(scope="session")
def tansu() -> Iterator[Broker]:
    """One Tansu broker for the whole test session (topics are named per test)."""
    with run_tansu() as broker:
        yield broker


@pytest.fixture(scope="session")
def sasl_front_session() -> Iterator[SaslFront]:
    """One authenticating front (tests/sasl_front.py) and its own Tansu broker for the session."""
    with SaslFront() as front:
        yield front


@pytest.fixture
def sasl_front(sasl_front_session: SaslFront) -> SaslFront:
    """The session's authenticating front, reset for this test: no users, no token, every mechanism,
    sessions that never expire, no events."""
    sasl_front_session.reset()
    return sasl_front_session


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
    from tests.support.spark import DRIVER_CONF

    session = spark_session("local[2]", [DRIVER_CONF])
    session.sparkContext.setLogLevel("ERROR")
    session.conf.set("spark.sql.shuffle.partitions", "2")  # test data is tiny: fewer tasks, faster stages
    yield session
    session.stop()
