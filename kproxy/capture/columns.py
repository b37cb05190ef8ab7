"""The capture's pending row group, kept column by column as rows come (compiled: one job, per record).

The writer thread (:mod:`kproxy.capture.writer`) turns captured exchanges into rows
(:class:`kproxy.capture.record_builder.RecordBuilder`) and keeps them here until a row group is due,
then makes Arrow columns of these lists. A row goes into its columns as it is made: one list
append per value, and the items of its list columns (partitions, rule decisions, payloads)
into their fields' lists. Adding rows as tuples and transposing each slice afterwards (what
this replaced) made and freed a tuple per row, a tuple per column and per slice, and extended
every list again, on the writer thread, holding the GIL.

Contract: :meth:`PendingColumns.add_row` adds a whole row or nothing (a row of the wrong width,
or an item of a list column of the wrong width, raises ValueError before any list is touched);
``values[i]`` holds column ``i``'s values, one per row (a list column: each row's items tuple,
None for a null list); ``items[i]`` (list columns only) holds one list per item field, every
row's items one after the other. No pyarrow here: the schema's shape comes as numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

HOUR_US: Final = 3_600_000_000


class PendingColumns:
    """Rows of a row group to be, column by column (see the module docstring)."""

    def __init__(self, columns: int, list_fields: dict[int, int], time_column: int) -> None:
        """``columns``: values per row; ``list_fields``: for each list column's index, the fields of
        its items; ``time_column``: the column of the request time (µs since the epoch: the hours)."""
        self.rows = 0
        self.width = columns
        self.time_column = time_column
        self.values: list[list[Any]] = [[] for _ in range(columns)]
        self.items: dict[int, list[list[Any]]] = {i: [[] for _ in range(n)] for i, n in list_fields.items()}
        self._lists: list[tuple[int, list[list[Any]]]] = sorted(self.items.items())

    def add_row(self, row: tuple[Any, ...]) -> None:
        """One row (a tuple in column order; nested lists as tuples of item tuples): all or nothing."""
        if len(row) != self.width:
            raise ValueError(f"a row of {len(row)} values, not {self.width}")
        for i, fields in self._lists:
            value = row[i]
            if value:
                width = len(fields)
                for item in value:
                    if len(item) != width:
                        raise ValueError(f"items of {len(item)} fields, not {width}")
        values = self.values
        for i in range(self.width):
            values[i].append(row[i])
        for i, fields in self._lists:
            value = row[i]
            if value:
                for item in value:
                    for j in range(len(fields)):
                        fields[j].append(item[j])
        self.rows += 1

    def add_rows(self, rows: list[tuple[Any, ...]]) -> None:
        """Each of ``rows`` in turn (a bad row raises: the rows before it are in, it and the rest are not)."""
        for row in rows:
            self.add_row(row)

    def clear(self, hand_over: Callable[[], None] | None = None) -> None:
        """Empty again, a column at a time, calling ``hand_over`` between columns (the writer's GIL
        hand-over, beside an event loop: freeing a row group's values, a few hundred thousand
        objects, at once would hold the GIL for the whole cascade)."""
        for values in self.values:
            values.clear()
            if hand_over is not None:
                hand_over()
        for fields in self.items.values():
            for values in fields:
                values.clear()
        self.rows = 0

    def hours(self) -> list[tuple[int, int, int]]:
        """Runs of consecutive rows of the same hour, (hour, first row, rows): rows arrive nearly
        in time order, so most row groups are one run."""
        times = self.values[self.time_column]
        if not times:
            return []
        first = times[0] // HOUR_US
        if first == min(times) // HOUR_US == max(times) // HOUR_US:
            return [(first, 0, len(times))]
        runs: list[tuple[int, int, int]] = []
        start = 0
        for i, t in enumerate(times):
            hour = t // HOUR_US
            if hour != first:
                runs.append((first, start, i - start))
                first, start = hour, i
        runs.append((first, start, len(times) - start))
        return runs
