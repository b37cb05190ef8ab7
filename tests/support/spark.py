"""Spark settings for the tests' own JVMs (drivers, executors, a standalone cluster's daemons).

The tests' Spark jobs are tiny and their JVMs short-lived: most of such a JVM's CPU goes to the
JIT's optimising compiler (C2) and to the parallel collector's threads, none of it repaid before
the JVM exits. The client compiler alone and the serial collector do the same work for less CPU.
They are not kproxy's defaults: a user's long job over millions of records needs C2's code.
"""

from __future__ import annotations

QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# Spark's "default" Java options come before the "extra" ones, which kproxy analyze sets itself
# (its quiet log4j configuration): the two do not replace each other.
DRIVER_CONF = ("spark.driver.defaultJavaOptions", QUICK_JVM)
EXECUTOR_CONF = ("spark.executor.defaultJavaOptions", QUICK_JVM)
