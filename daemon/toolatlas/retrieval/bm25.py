"""An immutable BM25 index over pre-tokenized documents (numpy postings).

Built in one vectorised pass (2k docs in milliseconds, 100k in a few seconds) off the event
loop and swapped in with the rest of a snapshot. A query scores every document at once
(a dense float32 vector), which makes scoping, fusion and "score of this candidate" trivial.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from toolatlas.retrieval.documents import Vocab

K1 = 1.2
B = 0.5


class Bm25Index:
    """BM25 (Lucene idf, k1=1.2, b=0.5) over `docs`, a list of token lists (or, with
    `of_terms`, of term-id byte strings: documents.Entry.terms)."""

    __slots__ = ("n_docs", "vocab", "n_terms", "_indptr", "_docs", "_weights", "n_unique", "idf", "k1", "max_idf")

    def __init__(self, docs: Sequence[Sequence[str]], *, k1: float = K1, b: float = B) -> None:
        vocab: dict[str, int] = {}
        tids = [vocab.setdefault(t, len(vocab)) for toks in docs for t in toks]
        lengths = np.fromiter((len(toks) for toks in docs), dtype=np.int64, count=len(docs))
        self._build(np.asarray(tids, dtype=np.int64), lengths, vocab, len(vocab), k1, b)

    @classmethod
    def of_terms(cls, terms: Sequence[bytes], vocab: Vocab, *, k1: float = K1, b: float = B) -> Bm25Index:
        """Over documents given as uint32 ids of `vocab`, 4 bytes a token. Ids `vocab` gives
        out after this (to later documents) are unknown words here."""
        self = cls.__new__(cls)
        n_terms = len(vocab)  # every id in `terms` is below it: they were encoded before
        lengths = np.fromiter((len(t) for t in terms), dtype=np.int64, count=len(terms)) // 4
        term = np.frombuffer(b"".join(terms), dtype=np.uint32).astype(np.int64)
        self._build(term, lengths, vocab.ids, n_terms, k1, b)
        return self

    @classmethod
    def of_counts(cls, doc: np.ndarray, term: np.ndarray, tf: np.ndarray, n_docs: int, vocab: Mapping[str, int],
                  *, k1: float = K1, b: float = B) -> Bm25Index:
        """Over documents given as (document, term id, count) triples, each pair once, every
        count above 0 and every id of `vocab` in some document: the index of the documents
        that repeat each term `count` times (the same weights to the last bit)."""
        self = cls.__new__(cls)
        lengths = np.bincount(doc, weights=tf, minlength=n_docs).astype(np.int64)
        order = np.lexsort((doc, term))  # term-major, as the postings are
        self._build(term[order], lengths, vocab, len(vocab), k1, b, doc=doc[order], tf=tf[order])
        return self

    def _build(self, term: np.ndarray, lengths: np.ndarray, vocab: Mapping[str, int], n_terms: int,
               k1: float, b: float, *, doc: np.ndarray | None = None, tf: np.ndarray | None = None) -> None:
        """`term`: every document's term ids, concatenated; `lengths`: tokens per document.
        With `doc` and `tf`: each (term, document) pair once, term-major, and its count."""
        n = lengths.shape[0]
        self.n_docs = n
        self.vocab = vocab
        self.n_terms = n_terms
        self.k1 = k1
        # idf of a term no document contains: the ceiling for unknown query words
        self.max_idf = float(np.log1p((n + 0.5) / 0.5))
        self.idf = np.zeros(n_terms, dtype=np.float32)
        self.n_unique = np.zeros(n, dtype=np.int64)
        if n == 0 or not term.shape[0]:
            self._indptr = np.zeros(n_terms + 1, dtype=np.int64)
            self._docs = np.empty(0, dtype=np.int32)
            self._weights = np.empty(0, dtype=np.float32)
            return
        if doc is None or tf is None:
            doc = np.repeat(np.arange(n, dtype=np.int64), lengths)
            keys, tf = np.unique(term * n + doc, return_counts=True)  # sorted: term-major
            t_of, d_of = keys // n, keys % n
        else:
            t_of, d_of = term, doc
        df = np.bincount(t_of, minlength=n_terms)
        idf = np.log1p((n - df + 0.5) / (df + 0.5))  # a term in no document: max_idf
        self.idf = idf.astype(np.float32)
        avgdl = max(float(lengths.mean()), 1e-9)
        norm = k1 * (1.0 - b + b * lengths[d_of] / avgdl)
        w = idf[t_of] * tf * (k1 + 1.0) / (tf + norm)
        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        self._indptr = indptr
        self._docs = d_of.astype(np.int32)
        self._weights = w.astype(np.float32)
        self.n_unique = np.bincount(d_of, minlength=n)

    @property
    def live_terms(self) -> int:
        """Terms at least one document has."""
        return int(np.count_nonzero(np.diff(self._indptr)))

    def query_ids(self, tokens: Sequence[str]) -> list[int]:
        """Known term ids of the query tokens, each once."""
        seen: dict[int, None] = {}
        for t in tokens:
            tid = self.vocab.get(t)
            if tid is not None and tid < self.n_terms:
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

    def ceiling(self, tokens: Sequence[str]) -> float:
        """The score a document matching every distinct query token with saturated tf would
        get: idf summed over the query (unknown words count at the highest idf) times k1 + 1.
        Dividing by it turns a BM25 score into "how much of this query the document covers"."""
        total = 0.0
        for t in set(tokens):
            tid = self.vocab.get(t)
            total += float(self.idf[tid]) if tid is not None and tid < self.n_terms else self.max_idf
        return total * (self.k1 + 1.0)
