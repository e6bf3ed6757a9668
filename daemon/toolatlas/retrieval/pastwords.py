"""The learned stage's lexical signal: BM25 over one document per tool made of the words of
the past queries that led to it (learned.py says whose words count, and how often).

A principal's documents differ from anyone else's only in the words that principal used:
another principal's word counts for a tool where at least `min_principals` principals other
than the reader used it, as often as each used it up to `cap`; the reader's own words count
in full. So `PastWords` sums every (tool, word) over all principals once per learned state,
and `index(own)` corrects only `own`'s entries: a principal's index costs its own entries and
one vectorised BM25 build, not a pass over every event (at 50,000 distinct past queries that
pass took about 0.2 s a principal, in the search of each principal after each publish)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from toolatlas.retrieval.bm25 import Bm25Index

_SHIFT = 32  # a (tool, word) pair's key: tool << 32 | word id


class PastWords:
    """Every (tool, word) pair of a learned state, with how many principals used the word for
    the tool (`n`) and their events using it, at most `cap` per principal (`capped`)."""

    __slots__ = ("cap", "capped", "keys", "min_principals", "n", "n_tools", "word_ids", "words", "_per")

    def __init__(self, per_tool: Sequence[Mapping[int, Mapping[str, int]]], *, cap: int, min_principals: int) -> None:
        """`per_tool[t]`: principal -> word -> events of that principal using the word for tool t."""
        self.cap, self.min_principals, self.n_tools = cap, min_principals, len(per_tool)
        self._per = per_tool
        seen: dict[str, object] = {}
        for per in per_tool:
            for ws in per.values():
                seen.update(ws)  # the words, in C
        self.words = list(seen)  # word id -> word
        self.word_ids = {w: i for i, w in enumerate(self.words)}
        keys, counts = self._entries((t, ws) for t, per in enumerate(per_tool) for ws in per.values())
        self.keys, inverse, n = np.unique(keys, return_inverse=True, return_counts=True)
        self.n = n.astype(np.int32)
        self.capped = np.bincount(inverse, weights=np.minimum(counts, cap), minlength=self.keys.shape[0]).astype(np.int32)

    def _entries(self, items: Iterable[tuple[int, Mapping[str, int]]]) -> tuple[np.ndarray, np.ndarray]:
        """(pair key, count) of every word of every (tool, words) in `items`."""
        word_of = self.word_ids.__getitem__
        tools, sizes, wids, counts = array("q"), array("q"), array("q"), array("q")
        for t, ws in items:
            tools.append(t)
            sizes.append(len(ws))
            wids.extend(map(word_of, ws))  # in C
            counts.extend(ws.values())
        return np.repeat(_ints(tools), _ints(sizes)) << _SHIFT | _ints(wids), _ints(counts)

    def index(self, own: int) -> Bm25Index:
        """The BM25 index principal `own` (-1: none) searches with."""
        tf = np.where(self.n >= self.min_principals, self.capped, 0).astype(np.int64)
        keys, c = self._entries((t, per[own]) for t, per in enumerate(self._per) if own in per)
        if keys.shape[0]:
            at = np.searchsorted(self.keys, keys)
            others = self.capped[at].astype(np.int64) - np.minimum(c, self.cap)
            tf[at] = np.where(self.n[at] - 1 >= self.min_principals, others, 0) + c
        live = tf > 0
        keys, tf = self.keys[live], tf[live]
        used, term = np.unique(keys & ((1 << _SHIFT) - 1), return_inverse=True)
        vocab = {self.words[i]: j for j, i in enumerate(used.tolist())}
        return Bm25Index.of_counts(keys >> _SHIFT, term.astype(np.int64), tf, self.n_tools, vocab)


def _ints(a: array[int]) -> np.ndarray:
    return np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, dtype=np.int64)
