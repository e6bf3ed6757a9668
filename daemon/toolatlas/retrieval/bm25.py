"""An immutable BM25 index over pre-tokenized documents (numpy postings).

Built in one vectorised pass (2k docs in milliseconds, 100k in a few seconds) off the event
loop and swapped in with the rest of a snapshot. A query scores every document at once
(a dense float32 vector), which makes scoping, fusion and "score of this candidate" trivial.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

K1 = 1.2
B = 0.75


class Bm25Index:
    """BM25 (Lucene idf, k1=1.2, b=0.75) over `docs`, a list of token lists."""

    __slots__ = ("n_docs", "vocab", "_indptr", "_docs", "_weights", "n_unique")

    def __init__(self, docs: Sequence[Sequence[str]], *, k1: float = K1, b: float = B) -> None:
        n = len(docs)
        self.n_docs = n
        vocab: dict[str, int] = {}
        tids: list[int] = []
        lengths = np.empty(n, dtype=np.int64)
        for i, toks in enumerate(docs):
            lengths[i] = len(toks)
            tids.extend(vocab.setdefault(t, len(vocab)) for t in toks)
        self.vocab = vocab
        n_terms = len(vocab)
        self.n_unique = np.zeros(n, dtype=np.int64)
        if n == 0 or not tids:
            self._indptr = np.zeros(n_terms + 1, dtype=np.int64)
            self._docs = np.empty(0, dtype=np.int32)
            self._weights = np.empty(0, dtype=np.float32)
            return
        term = np.asarray(tids, dtype=np.int64)
        doc = np.repeat(np.arange(n, dtype=np.int64), lengths)
        keys, tf = np.unique(term * n + doc, return_counts=True)  # sorted: term-major
        t_of = keys // n
        d_of = keys % n
        df = np.bincount(t_of, minlength=n_terms)
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        avgdl = max(float(lengths.mean()), 1e-9)
        norm = k1 * (1.0 - b + b * lengths[d_of] / avgdl)
        w = idf[t_of] * tf * (k1 + 1.0) / (tf + norm)
        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        self._indptr = indptr
        self._docs = d_of.astype(np.int32)
        self._weights = w.astype(np.float32)
        self.n_unique = np.bincount(d_of, minlength=n)

    def query_ids(self, tokens: Sequence[str]) -> list[int]:
        """Known term ids of the query tokens, each once."""
        seen: dict[int, None] = {}
        for t in tokens:
            tid = self.vocab.get(t)
            if tid is not None:
                seen[tid] = None
        return list(seen)

    def scores(self, tokens: Sequence[str]) -> np.ndarray:
        """BM25 score of every document for the query tokens (float32, zeros if no match)."""
        out = np.zeros(self.n_docs, dtype=np.float32)
        for tid in self.query_ids(tokens):
            s, e = self._indptr[tid], self._indptr[tid + 1]
            out[self._docs[s:e]] += self._weights[s:e]
        return out

    def overlap(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(number of distinct query terms in each doc, number of distinct terms per doc)."""
        out = np.zeros(self.n_docs, dtype=np.int64)
        for tid in self.query_ids(tokens):
            s, e = self._indptr[tid], self._indptr[tid + 1]
            out[self._docs[s:e]] += 1
        return out, self.n_unique
