"""The Spark session of ``kproxy analyze``: what it needs of the machine, and how it is set up.

* :func:`java_problem`: Spark's JVM is found the way PySpark's launcher finds it
  (``JAVA_HOME/bin/java``, else ``java`` on ``PATH``) and must be Java 17 or later; checked
  before Spark starts, so a missing Java is one line and not the launcher's trace.
* :func:`use_own_python`: Spark starts its Python workers with ``PYSPARK_PYTHON``, else with
  whatever ``python3`` comes first on ``PATH``, which is not this interpreter when the command
  runs by its full path (cron, systemd, a container entrypoint) and has no kproxy. Unless the
  user named one (the variable, or ``spark.pyspark.python``), the workers run this interpreter.
* :func:`ship_kproxy`: the what-if runs kproxy's rule engine on the executors; kproxy's own
  code (pure Python) goes to each of them as a zip on their Python path, so executors that do
  not have kproxy installed run it. Its dependencies the engine imports there (``pyyaml``,
  ``google-re2``, a compiled module that cannot travel in a zip) must be installed beside
  PySpark on the executors.
* :func:`spark_session`: the session itself, quiet on stderr unless asked.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from pyspark import SparkConf, SparkContext, java_gateway
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

import kproxy

JAVA_MIN = 17
JAVA_MISSING = f"Java {JAVA_MIN}+ not found (JAVA_HOME, PATH)"
_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """None when Spark's launcher will find Java 17+; else the one line saying what is wrong."""
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java", path=env.get("PATH", os.defpath))
    if not java or not os.access(java, os.X_OK):
        return JAVA_MISSING
    try:
        answer = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{java} does not run ({exc}): Java {JAVA_MIN}+ needed (JAVA_HOME, PATH)"
    found = _JAVA_VERSION.search(answer.stderr + answer.stdout)
    if found is not None:
        major = int(found.group(1))
        if major == 1 and found.group(2):  # 1.8: Java 8
            major = int(found.group(2))
        if major < JAVA_MIN:
            return f"{java} is Java {major}: Java {JAVA_MIN}+ needed (JAVA_HOME, PATH)"
    return None


def use_own_python(conf: Sequence[tuple[str, str]], environ: MutableMapping[str, str] | None = None) -> None:
    """Spark's Python workers (and the driver's, with ``spark-submit``) run this interpreter,
    unless ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` or their ``spark.pyspark.*`` settings
    in ``conf`` name one. Call before the session starts: PySpark reads them then."""
    env = os.environ if environ is None else environ
    named = {key for key, _ in conf}
    if "PYSPARK_PYTHON" not in env and "spark.pyspark.python" not in named:
        env["PYSPARK_PYTHON"] = sys.executable
    if "PYSPARK_DRIVER_PYTHON" not in env and "spark.pyspark.driver.python" not in named:
        env["PYSPARK_DRIVER_PYTHON"] = sys.executable


_SHIPPED: dict[str, str] = {}  # Spark application id -> the zip shipped to its executors


def ship_kproxy(spark: SparkSession) -> str:
    """kproxy's Python files, zipped once per session into a temporary directory (removed at
    exit) and added to every executor's Python path (``SparkContext.addPyFile``); the zip's path."""
    context = spark.sparkContext
    app = context.applicationId
    if app in _SHIPPED:
        return _SHIPPED[app]
    package = Path(kproxy.__file__).resolve().parent
    directory = tempfile.mkdtemp(prefix="kproxy-analyze-")
    atexit.register(shutil.rmtree, directory, True)
    target = os.path.join(directory, "kproxy.zip")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".typed"):
                archive.write(path, path.relative_to(package.parent).as_posix())
    context.addPyFile(target)
    _SHIPPED[app] = target
    return target


def spark_session(master: str = "local[*]", conf: Sequence[tuple[str, str]] = (), *,
                  verbose: bool = False) -> SparkSession:
    """A Spark session for the job: UTC, no UI, few shuffle partitions (aggregates are small),
    unreadable file content skipped rather than fatal; ``conf`` goes last and wins.

    Unless ``verbose``, Spark keeps quiet: no console progress bars (they filled stderr, between
    the command's own lines), its log at ERROR (a WARN of Spark's is rarely the user's to act on),
    and the driver JVM's start-up notices left out (:data:`JVM_NOTICES`, :func:`_quiet_gateway`);
    its errors still reach stderr.

    In local mode the driver is the executor too, and Spark's default driver memory (1 GiB) is
    short for millions of records: it gets :func:`local_driver_memory` unless ``conf`` names one.
    And the files are split into at least :data:`SPLITS_PER_CORE` reads per core
    (``spark.sql.files.minPartitionNum``): Spark packs files into splits of up to 128 MiB, and
    ten 32 MiB capture files made four splits on two cores, the last wave one split long with a
    core idle (a quarter of every pass); smaller splits keep both busy and hold fewer groups per
    task (an aggregation of more than 128 groups per task falls back to sorting its rows).

    Python workers run this interpreter unless told otherwise (:func:`use_own_python`).

    Raises :class:`SparkNotStarted` when the driver JVM exits before it serves (a setting it
    refuses, too little memory): what it wrote is on stderr.
    """
    use_own_python(conf)
    settings = [("spark.master", master), ("spark.app.name", "kproxy-analyze"),
                ("spark.sql.session.timeZone", "UTC"), ("spark.ui.enabled", "false"),
                ("spark.sql.shuffle.partitions", "8"),
                ("spark.ui.showConsoleProgress", "true" if verbose else "false"),
                # A corrupt page is skipped, not fatal: the job names the file (kproxy.analysis.job).
                ("spark.sql.files.ignoreCorruptFiles", "true")]
    if not verbose:
        # Spark's own start-up lines come before setLogLevel can act: the driver JVM (started with
        # these settings in local mode) reads a log4j2 configuration at ERROR instead of Spark's default.
        settings.append(("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_quiet_log4j2()}"))
    if master.startswith("local") and not any(key == "spark.driver.memory" for key, _ in conf):
        settings.append(("spark.driver.memory", local_driver_memory()))
    if master.startswith("local"):
        settings.append(("spark.sql.files.minPartitionNum", str(SPLITS_PER_CORE * local_cores(master))))
    settings += conf
    if not verbose and SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # This process starts the driver JVM (not spark-submit's, nor a second session's): its stderr
        # goes through a filter.
        SparkContext(conf=SparkConf().setAll(settings), gateway=_quiet_gateway(SparkConf().setAll(settings)))
    builder = SparkSession.builder
    for key, value in settings:
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


class SparkNotStarted(Exception):
    """The driver JVM exited before it served (its own lines on stderr say why)."""


# What the driver JVM writes to stderr before any log4j configuration can act, none of it the user's
# to act on: the JVM's notice of the incubator module Spark's launcher adds to every JVM it starts
# (``--add-modules=jdk.incubator.vector``: no JVM option silences it).
JVM_NOTICES = (b"WARNING: Using incubator modules: ",)


def _quiet_gateway(conf: SparkConf) -> Any:
    """PySpark's gateway to a driver JVM started with ``conf``, its stderr copied to this process's
    (file descriptor 2, where it would have gone) line by line by a daemon thread, but for the lines
    beginning with one of :data:`JVM_NOTICES`. Raises :class:`SparkNotStarted` when the JVM exits
    first, once its lines are copied."""
    read_end, write_end = os.pipe()
    copier = threading.Thread(target=_copy_stderr, args=(read_end,), name="kproxy-spark-stderr", daemon=True)
    copier.start()
    try:
        launch: Any = java_gateway.launch_gateway  # untyped
        return launch(conf, popen_kwargs={"stderr": write_end})
    except PySparkRuntimeError as exc:
        os.close(write_end)
        write_end = -1
        copier.join(timeout=10)  # the JVM has exited: its last lines come, then the end of the pipe
        raise SparkNotStarted(str(exc)) from exc
    finally:
        if write_end >= 0:
            os.close(write_end)  # the JVM holds its own copy


def _copy_stderr(fd: int) -> None:
    """Copy the lines read from ``fd`` to file descriptor 2 until the JVM closes its end; lines are
    read to the end even once file descriptor 2 fails (a closed pipe): else the JVM blocks writing."""
    with os.fdopen(fd, "rb") as lines:
        for line in lines:
            if line.startswith(JVM_NOTICES):
                continue
            left = memoryview(line)
            try:
                while left:
                    left = left[os.write(2, left):]
            except OSError:
                pass


_QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
# Spark's own loggers named at the root's level: Spark then leaves the console's level alone, and
# prints no "Setting default log level" of a shell.
logger.spark.name = org.apache.spark
logger.spark.level = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _quiet_log4j2() -> str:
    """A log4j2 configuration logging errors only, as a file URI (written once per temp directory)."""
    path = Path(tempfile.gettempdir()) / f"kproxy-analyze-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _QUIET_LOG4J2:
        path.write_text(_QUIET_LOG4J2)
    return path.as_uri()


SPLITS_PER_CORE = 4


def local_cores(master: str) -> int:
    """The cores a ``local``, ``local[N]``, ``local[*]`` or ``local[N, F]`` master runs tasks on."""
    found = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if found is None or found.group(1) is None:
        return 1
    return (os.cpu_count() or 1) if found.group(1) == "*" else max(1, int(found.group(1)))


def local_driver_memory(physical: int | None = None) -> str:
    """A quarter of this machine's memory, between 1 and 8 GiB (``spark.driver.memory`` syntax)."""
    if physical is None:
        try:
            physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            physical = 4 << 30
    return f"{min(8, max(1, physical // 4 >> 30))}g"
