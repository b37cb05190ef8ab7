"""Capture rows and record dicts, one into the other: for producers of ready records and for tests.

A row is a tuple in the order of :data:`kproxy.capture.record_schema.COLUMN_NAMES`, its nested lists
as tuples in their item order (what :class:`kproxy.capture.record_builder.RecordBuilder` makes and the
writer turns into Arrow columns); a record dict is what Arrow's ``to_pylist`` reads back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kproxy.capture.record_schema import COLUMN_NAMES, PARTITION_ITEMS, PAYLOAD_ITEMS, RULE_DECISION_ITEMS

# Where the nested lists are in a row (by name: a nullable column added since may follow them).
_PARTITIONS, _DECISIONS, _PAYLOADS = (COLUMN_NAMES.index(name) for name in ("partitions", "rule_decisions", "payloads"))
PARTITION_FIELDS = tuple(c.name for c in PARTITION_ITEMS)
RULE_DECISION_FIELDS = tuple(c.name for c in RULE_DECISION_ITEMS)
PAYLOAD_FIELDS = tuple(c.name for c in PAYLOAD_ITEMS)


def as_dict(row: Sequence[Any]) -> dict[str, Any]:
    """A row as a record dict (nested lists as lists of dicts): the form Arrow's ``to_pylist`` reads back."""
    out = dict(zip(COLUMN_NAMES, row, strict=True))
    out["partitions"] = [dict(zip(PARTITION_FIELDS, p, strict=True)) for p in out["partitions"]]
    out["rule_decisions"] = [dict(zip(RULE_DECISION_FIELDS, d, strict=True)) for d in out["rule_decisions"]]
    if out["payloads"] is not None:
        out["payloads"] = [dict(zip(PAYLOAD_FIELDS, p, strict=True)) for p in out["payloads"]]
    return out


def dict_rows(batch: Iterable[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows of record dicts (:func:`kproxy.capture.record_schema.new_record`): for producers of ready records."""
    out = []
    for rec in batch:
        row = [rec[name] for name in COLUMN_NAMES]
        # (get: the nullable fields version 3 added may be left out of a ready record's items)
        row[_PARTITIONS] = tuple(tuple(p.get(f) for f in PARTITION_FIELDS) for p in row[_PARTITIONS])
        row[_DECISIONS] = tuple(tuple(d[f] for f in RULE_DECISION_FIELDS) for d in row[_DECISIONS])
        if row[_PAYLOADS] is not None:
            row[_PAYLOADS] = tuple(tuple(p[f] for f in PAYLOAD_FIELDS) for p in row[_PAYLOADS])
        out.append(tuple(row))
    return out
