"""The message-kind matrices of the codec tests, cut to what each run needs to keep their power.

Every run checks the boundary versions of each api and direction (its lowest, its highest and its
first flexible one: where a layout starts, ends and changes encoding) and a seeded random sample of
the versions between them; the sample changes from run to run, so the whole matrix is covered over
runs. The seed is chosen once per run (tests/conftest.py's ``pytest_configure``, before any xdist
worker starts, so every worker collects the same sample), printed in the report's header, and read
back from ``KPROXY_MATRIX_SEED``: ``KPROXY_MATRIX_SEED=1234 pytest ...`` repeats a run's sample,
and ``KPROXY_MATRIX_SEED=all`` runs the whole matrix.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from kproxy.protocol.schema import is_flexible

SEED_VARIABLE = "KPROXY_MATRIX_SEED"
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


def boundary_versions(api_key: int, versions: Sequence[int]) -> set[int]:
    """Of ``versions`` (of one api and direction): the lowest, the highest, the first flexible."""
    chosen = {min(versions), max(versions)}
    flexible = [v for v in versions if is_flexible(api_key, v)]
    if flexible:
        chosen.add(min(flexible))
    return chosen


def matrix_cut(kinds: Sequence[T], api_version: Callable[[T], tuple[int, int]],
               group: Callable[[T], Hashable] | None = None, name: str = "") -> list[T]:
    """``kinds`` (in their order) cut to this run's: each group's boundary versions (see
    :func:`boundary_versions`; a group is an api and direction, or what ``group`` says), and a
    sample of :data:`SHARE` of the rest drawn with this run's seed (and ``name``, so that each
    matrix draws its own)."""
    seed = matrix_seed()
    if seed == "all":
        return list(kinds)
    keys = [api_version(kind) for kind in kinds]
    groups = [group(kind) if group else api_key for kind, (api_key, _) in zip(kinds, keys, strict=True)]
    by_group: dict[Hashable, list[int]] = {}
    for g, (_, version) in zip(groups, keys, strict=True):
        by_group.setdefault(g, []).append(version)
    boundaries = {g: boundary_versions(keys[i][0], by_group[g]) for i, g in enumerate(groups)}
    rest = [i for i, (g, (_, version)) in enumerate(zip(groups, keys, strict=True)) if version not in boundaries[g]]
    draw = random.Random(f"{seed}:{name}")
    dropped = set(rest) - set(draw.sample(rest, round(len(rest) * SHARE)))
    return [kind for i, kind in enumerate(kinds) if i not in dropped]
