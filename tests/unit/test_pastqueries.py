"""The learned state's compact parts (retrieval/pastqueries.py) and the past query vectors
above HNSW_MIN_EVENTS: 8-bit rows, principal coordinates in hnswlib, growth past the first
allocation with earlier states still reading their own rows."""

from __future__ import annotations

import numpy as np
import pytest

from toolatlas.retrieval import learned as L
from toolatlas.retrieval.pastqueries import Asked, RowTools, grown
from toolatlas.retrieval.usage import UsageEvent


def test_asked_keeps_each_triple_once_and_finds_a_key_among_many() -> None:
    asked = Asked.empty().merged(np.array([[7, 1, 0], [-3, 2, 1], [7, 1, 0], [7, 4, 2]], dtype=np.int64))
    asked = asked.merged(np.array([[7, 1, 3], [2**62, 0, 0], [7, 4, 2]], dtype=np.int64))
    assert asked.of(7) == {1: [0, 3], 4: [2]}
    assert asked.of(-3) == {2: [1]} and asked.of(2**62) == {0: [0]} and asked.of(5) == {}
    assert asked.key.tolist() == sorted(asked.key.tolist()) and asked.key.shape[0] == 5


def test_row_tools_count_repeats_and_keep_empty_rows() -> None:
    first = RowTools.empty().merged(np.array([[0, 3], [2, 1], [0, 3], [0, 1]], dtype=np.int64), 3)
    assert [dict(first.of(r)) for r in range(3)] == [{1: 1, 3: 2}, {}, {1: 1}]
    second = first.merged(np.array([[1, 5], [0, 3], [3, 0]], dtype=np.int64), 4)
    assert [dict(second.of(r)) for r in range(4)] == [{1: 1, 3: 3}, {5: 1}, {1: 1}, {0: 1}]
    assert [dict(first.of(r)) for r in range(3)] == [{1: 1, 3: 2}, {}, {1: 1}]  # unchanged
    ends, tools, counts = second.of_rows(np.array([3, 0, 1], dtype=np.int64))
    assert (ends, tools, counts) == ([1, 3, 4], [0, 1, 3, 5], [1, 1, 3, 1])
    assert second.of_rows(np.zeros(0, dtype=np.int64)) == ([], [], [])


def test_backers_count_each_principal_once_per_tool() -> None:
    # rows 0-3 lead to {1, 3}, {5}, {1}, {0}
    rt = RowTools.empty().merged(np.array([[0, 1], [0, 3], [1, 5], [2, 1], [3, 0]], dtype=np.int64), 4)
    rows = np.array([0, 2, 1, 3], dtype=np.int64)
    # rows 0 and 2 are principal 7's (tool 1 twice: once), row 1 principal 8's, row 3 principal 9's
    assert rt.backers(rows, np.array([7, 7, 8, 9]), 6).tolist() == [1, 1, 0, 1, 0, 1]
    assert rt.backers(rows, np.array([7, 8, 8, 9]), 6).tolist() == [1, 2, 0, 1, 0, 1]
    assert rt.backers(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 3).tolist() == [0, 0, 0]


def test_grown_keeps_the_rows_and_leaves_the_old_array_alone() -> None:
    a = grown(np.zeros((0, 0), dtype=np.float32), 0, 3, (2,))
    assert a.shape == (1024, 2)
    a[:3] = 1.0
    assert grown(a, 3, 1000, (2,)) is a
    b = grown(a, 3, 1022, (2,))
    assert b.shape == (2048, 2) and b[:3].tolist() == [[1.0, 1.0]] * 3 and b is not a
    b[0] = 5.0
    assert a[0].tolist() == [1.0, 1.0]


def test_neighbours_stay_right_as_the_8_bit_rows_grow_past_their_first_allocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(L, "HNSW_MIN_EVENTS", 64)
    rng = np.random.default_rng(5)  # 160 dimensions: hnswlib holds PROJ_DIMS (128) coordinates of each
    vecs = rng.normal(size=(2600, 160)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    idx = L.LearningIndex()
    states = []
    for lo, hi in [(0, 100), (100, 900), (900, 2600)]:
        idx.add([UsageEvent(query=f"q{i}", tool=f"t{i % 5}", principal="p", at=0.0, vector=vecs[i])
                 for i in range(lo, hi)])
        states.append((idx.state(0.0), hi))
    assert states[0][0].q8 is not None and states[2][0].q8 is not None
    assert states[2][0].q8 is not states[0][0].q8  # grown: the older states keep theirs
    for state, rows in states:
        assert state.rows == rows
        for q in vecs[::97]:
            got, sims = L.neighbours(state, q, 10)
            exact = vecs[:rows] @ q
            want = np.sort(exact)[::-1][:10]
            assert got.max() < rows
            # hnswlib's candidates are approximate: nearly all of the exact ten, scored right
            assert len(set(got.tolist()) & set(np.argsort(-exact)[:10].tolist())) >= 8
            assert np.abs(sims - exact[got]).max() < 0.005 and sims[0] >= want[0] - 0.005


def test_a_few_merged_in_give_the_arrays_a_full_sort_gives() -> None:
    # a publish merges a few new items into many by insertion: the same arrays as sorting
    # everything again, repeats of held items and of each other included
    rng = np.random.default_rng(9)
    keys = rng.integers(-(2**62), 2**62, 300)
    triples = np.stack([rng.choice(keys, 4000), rng.integers(0, 40, 4000), rng.integers(0, 4, 4000)], axis=1)
    uses = np.stack([np.sort(rng.integers(0, 900, 4000)), rng.integers(0, 40, 4000)], axis=1)
    asked, rows = Asked.empty().merged(triples[:3000]), RowTools.empty().merged(uses[:3000], int(uses[2999, 0]) + 1)
    for lo in range(3000, 4000, 50):
        few = np.concatenate([triples[lo : lo + 50], triples[lo - 7 : lo - 4]])  # some held already
        asked = asked.merged(few)
        more = np.concatenate([uses[lo : lo + 50], uses[lo - 3 : lo]])
        rows = rows.merged(more, int(uses[lo + 49, 0]) + 1)
    whole = Asked.empty().merged(triples)
    for got, want in [(asked.key, whole.key), (asked.tool, whole.tool), (asked.principal, whole.principal)]:
        assert got.tolist() == want.tolist()
    dup = np.concatenate([uses[:3000]] + [uses[lo - 3 : lo] for lo in range(3000, 4000, 50)] + [uses[3000:]])
    full = RowTools.empty().merged(dup, int(uses[-1, 0]) + 1)
    assert rows.start.tolist() == full.start.tolist() and rows.tool.tolist() == full.tool.tolist()
    assert rows.count.tolist() == full.count.tolist()
