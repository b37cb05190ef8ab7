"""Keeping idle cores polling for the length of a benchmark (``bench_publish.py --idle-poll``).

On a virtual machine an idle core is a vCPU that halts, and a halted vCPU hands its physical core
back to the host: the next wake-up (a packet for the broker, a timer for the producer) waits until
the host runs that vCPU again, which on a shared host can take milliseconds. A fixed-rate producer
wakes every core thousands of times a second, so those waits, not the software on the path, then
set its p99, for direct as much as for any proxy. Holding the kernel's PM QoS CPU latency request
at 0 (``/dev/cpu_dma_latency``, as tuned's latency-performance profile does) makes the cpuidle
governor pick only states that need no wake-up, the polling one: the core stays with the guest.
The request lasts while the file stays open, so it ends with the block (or the process) whatever
happens. Polling is idle time to the kernel: no process's CPU figure includes it.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

PM_QOS_CPU_LATENCY = "/dev/cpu_dma_latency"
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")


def idle_driver() -> str:
    """The cpuidle driver in use ("none" where the kernel has no cpuidle), for the report."""
    try:
        return (CPUIDLE / "current_driver").read_text().strip() or "none"
    except OSError:
        return "none"


@contextlib.contextmanager
def cores_polled_when_idle() -> Iterator[str]:
    """Hold the CPU latency request at 0 µs until the block exits; yields a phrase for the report.

    Raises SystemExit saying why when the request cannot be made (not root, no such device):
    a run asked to poll that silently did not would be recorded as if it had."""
    try:
        fd = os.open(PM_QOS_CPU_LATENCY, os.O_WRONLY)
    except OSError as exc:
        raise SystemExit(f"--idle-poll: cannot open {PM_QOS_CPU_LATENCY} ({exc.strerror}); it needs root "
                         "and a kernel with PM QoS") from exc
    try:
        os.write(fd, struct.pack("=i", 0))
        yield f"idle cores polling (PM QoS CPU latency 0 µs held; cpuidle driver {idle_driver()})"
    finally:
        os.close(fd)
