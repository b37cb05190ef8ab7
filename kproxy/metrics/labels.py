"""Label values that stay bounded whatever clients send: a cap on distinct values and on length."""

from __future__ import annotations

OTHER = "other"
# Client ids are up to 32 KiB on the wire; real ones ("producer-1", "app-StreamThread-3-consumer-<uuid>")
# fit well within this. Longer values are cut (and marked), so a label never costs more than this.
MAX_LABEL_LENGTH = 128
_CUT_MARK = "~"


class LabelCap:
    """Lets the first ``limit`` distinct values through; every later one is ``other``.

    Values longer than :data:`MAX_LABEL_LENGTH` are cut to it (the last character
    becomes ``~``), so ``limit`` values cost at most ``limit * MAX_LABEL_LENGTH``.
    """

    __slots__ = ("limit", "seen")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(value) > MAX_LABEL_LENGTH:
            value = value[:MAX_LABEL_LENGTH - 1] + _CUT_MARK
            if value in self.seen:
                return value
        if len(self.seen) < self.limit:
            self.seen.add(value)
            return value
        return OTHER


def cut_label(value: str) -> str:
    """``value`` as a label: cut to :data:`MAX_LABEL_LENGTH` (the last character becomes ``~``) when longer."""
    return value if len(value) <= MAX_LABEL_LENGTH else value[:MAX_LABEL_LENGTH - 1] + _CUT_MARK
