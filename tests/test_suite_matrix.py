"""The cut of the codec matrices (tests/support/matrix.py): every api's boundary versions in every
run, a sample of the rest that the seed decides, and the whole matrix when asked."""

from __future__ import annotations

import pytest

from kproxy.protocol import MessageType
from kproxy.protocol.message_schemas import all_message_kinds, is_flexible, message_schema
from tests.support.matrix import SEED_VARIABLE, SHARE, boundary_versions, matrix_cut

KINDS = all_message_kinds()


def cut(seed: str, monkeypatch: pytest.MonkeyPatch, name: str = "m") -> list[tuple[int, int, MessageType]]:
    monkeypatch.setenv(SEED_VARIABLE, seed)
    return matrix_cut(KINDS, lambda k: k, name)


def test_boundary_versions_are_the_ends_the_first_flexible_and_both_sides_of_each_layout_change() -> None:
    produce = list(range(3, 13))
    first_flexible = min(v for v in produce if is_flexible(0, v))
    chosen = boundary_versions(0, MessageType.REQUEST, produce)
    assert {3, 12, first_flexible, first_flexible - 1} <= chosen
    assert boundary_versions(0, MessageType.REQUEST, [4]) == {4}
    # Fetch responses: error_code and session_id start at v7, so v6 and v7 are both checked every run.
    fetch = message_schema(1, 7, MessageType.RESPONSE)
    assert fetch is not None and "error_code" in [f.name for f in fetch.fields]
    assert {6, 7} <= boundary_versions(1, MessageType.RESPONSE, list(range(4, 19)))
    # And a version whose layout is the same as both neighbours' is not a boundary.
    def layout(version: int) -> object:
        schema = message_schema(0, version, MessageType.REQUEST)
        assert schema is not None
        return schema.fields, schema.flexible

    same = [v for v in range(1, 12) if layout(v - 1) == layout(v) == layout(v + 1)]
    assert same and not set(same) & boundary_versions(0, MessageType.REQUEST, list(range(0, 13)))


def test_every_run_keeps_each_apis_boundaries_in_each_direction(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = set(cut("1", monkeypatch))
    groups: dict[tuple[int, MessageType], list[int]] = {}
    for api_key, version, direction in KINDS:
        groups.setdefault((api_key, direction), []).append(version)
    for (api_key, direction), versions in groups.items():
        for version in boundary_versions(api_key, direction, versions):
            assert (api_key, version, direction) in kept, (api_key, version, direction)


def test_the_seed_decides_the_sample_and_all_runs_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    one, again, other = cut("1", monkeypatch), cut("1", monkeypatch), cut("2", monkeypatch)
    assert one == again  # the same seed, the same tests: xdist's workers collect alike, a failure repeats
    assert one != other
    assert cut("1", monkeypatch, "another matrix") != one
    assert cut("all", monkeypatch) == KINDS
    assert one == [k for k in KINDS if k in set(one)]  # in the matrix's order
    groups: dict[tuple[int, MessageType], list[int]] = {}
    for api_key, version, direction in KINDS:
        groups.setdefault((api_key, direction), []).append(version)
    rest = [k for k in KINDS if k[1] not in boundary_versions(k[0], k[2], groups[(k[0], k[2])])]
    assert len([k for k in one if k in set(rest)]) == round(len(rest) * SHARE)


def test_a_malformed_seed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=f"{SEED_VARIABLE}='x1'"):
        cut("x1", monkeypatch)
