"""``kproxy analyze``'s ``by_cluster`` table: a capture of several clusters, its traffic per cluster.

Records made up with known clusters (tests/support/capture.py), written by the capture's own
writer, analysed by the job; records of a file written before the ``cluster`` column read as null.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from kproxy.capture.writer import CaptureWriter
from tests.support.capture import record


def test_traffic_is_told_apart_by_cluster(spark: Any, tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis

    rows = []
    for i in range(30):  # connections c0, c1, c2 (record's i % 3): c0 and c1 orders, c2 payments
        cluster = "payments" if i % 3 == 2 else "orders"
        rows.append(record(i, cluster=cluster, record_count=2, record_bytes=70, error_code=6 if i < 3 else 0))
    rows += [record(100 + i, connection_id="old", cluster=None) for i in range(4)]  # before the column
    writer = CaptureWriter(tmp_path / "capture", max_bytes_total=10**9, rotate_bytes=10**8,
                           rotate_seconds=3600).start()
    for row in rows:
        assert writer.offer(row)
    writer.close()
    result = run_analysis([str(tmp_path / "capture")], tmp_path / "out", spark, interval=60)
    got = {r["cluster"]: r for r in result.tables["by_cluster"]}
    assert set(got) == {"orders", "payments", None}
    assert {k: (v["connections"], v["requests"], v["records"], v["errors"], v["produced_bytes"],
                v["request_bytes"]) for k, v in got.items()} == {
        "orders": (2, 20, 40, 2, 20 * 70, 20 * 100),
        "payments": (1, 10, 20, 1, 10 * 70, 10 * 100),
        None: (1, 4, 0, 0, 0, 4 * 100),
    }
