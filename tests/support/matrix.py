"""The message-kind matrices of the codec tests, cut to what each run needs to keep their power.

Every run checks the boundary versions of each api and direction (its lowest, its highest, its
first flexible one, and both sides of every change of its layout) and a seeded random sample of the
versions whose layout is the same as both neighbours'; the sample changes from run to run, so the
whole matrix is covered over runs. The seed is chosen once per run (tests/conftest.py's
``pytest_configure``, before any xdist worker starts, so every worker collects the same sample),
printed in the report's header, and read back from ``CODEC_MATRIX_SEED``:
``CODEC_MATRIX_SEED=1234 pytest ...`` repeats a run's sample, and ``CODEC_MATRIX_SEED=all`` runs
the whole matrix.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from kproxy.protocol import MessageType
from kproxy.protocol.message_schemas import is_flexible, message_schema

SEED_VARIABLE = "CODEC_MATRIX_SEED"
SHARE = 0.15  # of the versions between the boundaries, sampled in each run

T = TypeVar("T")


def matrix_seed() -> str:
    """This run's seed (a decimal number, or ``all``), set by tests/conftest.py for the run."""
    seed = os.environ.get(SEED_VARIABLE, "").strip()
    if not seed:
        raise RuntimeError(f"{SEED_VARIABLE} is not set: tests/conftest.py's pytest_configure sets it for each run")
    if seed != "all" and not seed.isdigit():
        raise ValueError(f"{SEED_VARIABLE}={seed!r}: a decimal number, or 'all' for the whole matrix")
    return seed


def boundary_versions(api_key: int, direction: MessageType, versions: Sequence[int]) -> set[int]:
    """Of ``versions`` (of one api and direction): the lowest, the highest, the first flexible, and on
    each side of every change of layout (a version whose fields differ from the version before it,
    and that version before): a bug that moves where a field starts or ends shows on one side."""
    chosen = {min(versions), max(versions)}
    flexible = [v for v in versions if is_flexible(api_key, v)]
    if flexible:
        chosen.add(min(flexible))
    present = set(versions)
    for version in versions:
        before = message_schema(api_key, version - 1, direction) if version - 1 in present else None
        now = message_schema(api_key, version, direction)
        if before is not None and now is not None and (before.fields, before.flexible) != (now.fields, now.flexible):
            chosen |= {version - 1, version}
    return chosen


def matrix_cut(kinds: Sequence[T], kind_of: Callable[[T], tuple[int, int, MessageType]], name: str = "") -> list[T]:
    """``kinds`` (in their order) cut to this run's: the boundary versions of each api and direction
    (:func:`boundary_versions`; ``kind_of`` says which api, version and direction an element checks),
    and a sample of :data:`SHARE` of the rest drawn with this run's seed (and ``name``, so that each
    matrix draws its own)."""
    seed = matrix_seed()
    if seed == "all":
        return list(kinds)
    keys = [kind_of(kind) for kind in kinds]
    by_group: dict[tuple[int, MessageType], list[int]] = {}
    for api_key, version, direction in keys:
        by_group.setdefault((api_key, direction), []).append(version)
    boundaries = {(a, d): boundary_versions(a, d, versions) for (a, d), versions in by_group.items()}
    rest = [i for i, (a, version, d) in enumerate(keys) if version not in boundaries[(a, d)]]
    draw = random.Random(f"{seed}:{name}")
    dropped = set(rest) - set(draw.sample(rest, round(len(rest) * SHARE)))
    return [kind for i, kind in enumerate(kinds) if i not in dropped]
