"""The order documents are embedded in (issue 19 item 4): shortest text first, so a batch's
padding is small, and the queue follows the catalog's changes. Real IndexBuilder, no model."""

from __future__ import annotations

import numpy as np

from toolatlas.retrieval.documents import ToolDoc
from toolatlas.retrieval.index import IndexBuilder, plan_update


def _doc(i: int, words: int) -> ToolDoc:
    return ToolDoc(name=f"s__t{i}", server="s", tool=f"t{i}", description=" ".join(["word"] * words) + f" {i}",
                   input_schema={"type": "object"})


def _builder(docs: list[ToolDoc]) -> IndexBuilder:
    b = IndexBuilder({"embeddings_computed": 0, "embeddings_cached": 0, "embeddings_shared": 0})
    b.entries, _ = plan_update({}, docs, [], b.vocab)
    return b


def test_pending_is_shortest_first_and_skips_what_has_a_vector() -> None:
    lengths = [30, 2, 50, 9, 1, 17]
    b = _builder([_doc(i, n) for i, n in enumerate(lengths)])
    first = b.pending(3)
    assert [len(t) for t in first.values()] == sorted(len(t) for t in first.values())
    assert sorted(len(t) for t in first.values()) == sorted(len(e.text) for e in b.entries.values())[:3]
    assert b.pending(3) == first  # nothing embedded yet: the same texts again
    b.add_vectors(list(first), np.zeros((3, 4), dtype=np.float32))
    rest = b.pending(10)
    assert len(rest) == 3 and not set(rest) & set(first)
    assert [len(t) for t in rest.values()] == sorted(len(e.text) for e in b.entries.values())[3:]
    # a vector that arrives out of order (another replica's) is skipped, not embedded again
    middle = list(rest)[1]
    b.add_shared({middle: np.zeros(4, dtype=np.float32)})
    assert middle not in b.pending(10) and len(b.pending(10)) == 2


def test_pending_follows_a_new_entries_dict() -> None:
    b = _builder([_doc(i, 5) for i in range(4)])
    assert len(b.pending(10)) == 4
    b.entries, _ = plan_update(b.entries, [_doc(9, 1)], ["s__t0", "s__t1"], b.vocab)
    texts = list(b.pending(10).values())
    assert len(texts) == 3 and texts[0] == b.entries["s__t9"].text  # the new, shortest one first
    assert b.entries.get("s__t0") is None
