"""The bounded budget every per-frame reader of records runs under, whoever calls it.

Compressed records cost more to read than they take on the wire: gzip shrinks a
run of identical 26-byte legacy messages about a thousand-fold, so 160 KB of a
Produce request are 2.5 million messages to walk, and a records field can pack
many such wrappers. Whatever reads the records of one frame (the metrics'
count, the capture's count and payloads, the rules' record editors) is given one
:class:`RecordBudget` for the whole frame, spends it as it goes, and gives up on
the frame once it is spent: the caller counts that and forwards the frame as it
came. So the cost of a frame is bounded however many wrappers it packs.

What is charged
---------------
* every decompressed byte: a compressed payload is decompressed within what is
  left (:meth:`RecordBudget.limit`), never past it;
* :data:`RECORD_COST` bytes per record or legacy message a reader turns into a
  Python object or edits one by one (the costly part of decoding and editing):
  so a budget bounds the time of a walk of tiny records too. Counting only reads
  message sizes (an order of magnitude cheaper) and is charged bytes alone.

Reading the frame's own uncompressed bytes is not charged: the proxy already
holds them and their size is bounded by the frame size limit.
"""

from __future__ import annotations

from typing import Final

from kproxy.protocol.errors import OverBudgetError

#: The budget of one frame unless a caller says otherwise, in bytes: Kafka's default
#: ``message.max.bytes`` (1 MiB), so a batch any broker takes by default is read whole. A frame
#: read to its last byte is bounded alike whether it is 1 MiB inflated, 40,000 legacy messages
#: counted, or 16,384 records decoded or edited (docs/PERFORMANCE.md has the worst case's CPU).
DEFAULT_RECORD_BUDGET: Final = 1024 * 1024

#: What one record (or legacy message) decoded or edited costs of a budget, in bytes, on top of
#: the bytes decompressed to get at it.
RECORD_COST: Final = 64


class RecordBudget:
    """What reading the records of one frame may still cost, in bytes (see the module docstring).

    One per frame, shared by every records field and every reader of that frame,
    passed explicitly. ``exhausted`` is set once a reader needed more than was
    left: that reader stopped and said so (a count flagged incomplete, or
    :class:`~kproxy.protocol.errors.OverBudgetError`); what it read before stands.
    Not thread-safe: a budget belongs to the one thread reading its frame.
    """

    __slots__ = ("exhausted", "remaining", "total")

    def __init__(self, nbytes: int = DEFAULT_RECORD_BUDGET) -> None:
        if nbytes < 0:
            raise ValueError(f"a record budget is >= 0 bytes, not {nbytes}")
        self.total = nbytes
        self.remaining = nbytes
        self.exhausted = False

    def limit(self, max_decompressed: int) -> int:
        """The most one decompression may produce now: ``max_decompressed`` or what is left."""
        return min(max_decompressed, self.remaining)

    def spend(self, nbytes: int, *, offset: int | None = None) -> None:
        """Charge ``nbytes``; raises :class:`OverBudgetError` (and is exhausted) when they do not fit."""
        if nbytes > self.remaining:
            raise self.give_up(offset)
        self.remaining -= nbytes

    def give_up(self, offset: int | None = None) -> OverBudgetError:
        """Mark the budget spent; the error to raise, naming the frame position (``offset``)."""
        self.remaining = 0
        self.exhausted = True
        return OverBudgetError(f"reading these records needs more than the frame's {self.total}-byte budget",
                               offset=offset, field="records")
