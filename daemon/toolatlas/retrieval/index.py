"""The index: a frozen `Snapshot` searches read, and the `IndexBuilder` that makes the next one.

A snapshot is immutable once built (its scope cache only memoises pure functions of it) and
is published by one attribute assignment, so a search never sees a half-built index. The one
shared mutable piece is the hnswlib store (see hnsw.py): each snapshot keeps its own label ->
position map and vectors, so a search on an older snapshot stays consistent.

The builder holds what carries over between versions (entries, embedding cache, hnswlib store)
and runs a change (embed what is missing, insert, delete the stale, snapshot); no lock of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from toolatlas.retrieval import persist, rows
from toolatlas.retrieval.bm25 import Bm25Index
from toolatlas.retrieval.documents import Entry, ToolDoc, Vocab, doc_key, in_vocab, make_entry

if TYPE_CHECKING:
    from toolatlas.retrieval.embed import Embedder
    from toolatlas.retrieval.hnsw import HnswStore
    from toolatlas.retrieval.shared import SharedVectors

log = logging.getLogger(__name__)

EMBED_BATCH = 256  # texts per embedder call while indexing
_SCOPE_CACHE_MAX = 256
# Above COMPACT_ABOVE documents the rows are int16 with a scale each (rows.py; 77 MB less at
# 100,000 tools); a smaller catalog, both dev sets included, keeps exact float32 rows.
COMPACT_ABOVE: int | None = 4096
# The builder starts a new BM25 vocabulary (documents.Vocab) when the one its entries use has
# more than this many terms and more than twice those any entry has: ids are never reused,
# so a catalog whose texts keep changing words would otherwise grow it for as long as the
# daemon runs. 100,000 bench tools have 4,067 terms; the rebuild encodes every entry again.
VOCAB_RENEW_MIN = 50_000

# From PROJECT_MIN documents (rank.HNSW_MIN's value: below it no search reads hnswlib) hnswlib
# holds each vector's first PROJECT_DIMS coordinates in the principal basis of the vectors it
# was built from, not the vector (hnsw.py): the snapshot's float32 rows are the one full copy,
# and rank.dense scores twice the candidates it keeps on them. ~100 MB less at 100,000 tools;
# recall of the dense pool as before on real texts (bench/README.md, stop 42).
PROJECT_MIN = 4096
PROJECT_DIMS = 128
# HnswStore.drifted: a basis keeps ~0.86 of its own texts' vectors; of other texts 0.67 and
# the pool's recall falls to 0.947; 0.83 still gives 0.998 (bench/README.md, stop 42)
BASIS_SLACK = 0.05

# scope (sorted server names) -> (allowed positions, their hnsw labels once asked for)
ScopeCache = dict[tuple[str, ...], tuple[np.ndarray, frozenset[int] | None]]


@dataclass(frozen=True, eq=False)
class Snapshot:
    """One published catalog version: documents, BM25, dense vectors, server groupings."""

    version: int
    docs: tuple[ToolDoc, ...]
    servers: tuple[str, ...]
    server_pos: dict[str, np.ndarray]
    doc_server: np.ndarray  # index into `servers` per position
    bm25: Bm25Index
    vecs: np.ndarray | None  # (n, dim) normalised (int16 above COMPACT_ABOVE rows, see `scales`); None when bm25-only
    labels: np.ndarray | None  # hnsw label per position
    label_pos: np.ndarray  # position per hnsw label below its length (-1: not in this snapshot)
    centroids: np.ndarray | None  # (len(servers), dim)
    hnsw: HnswStore | None = None  # the shared dense index the labels point into
    scales: np.ndarray | None = None  # (n,) float32: an int16 row times its scale is the vector
    scope_cache: ScopeCache = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.docs)

    def rows(self, pos: np.ndarray | None = None) -> np.ndarray:
        """The vectors at positions `pos` (None: all), float32 whatever the storage."""
        assert self.vecs is not None
        return rows.take(self.vecs, self.scales, pos)

    def sims(self, qvec: np.ndarray, pos: np.ndarray | None = None) -> np.ndarray:
        """Cosine similarities (float32) of `qvec` to the vectors at `pos` (None: all)."""
        assert self.vecs is not None
        return rows.sims(self.vecs, self.scales, qvec, pos)

    @functools.cached_property
    def pos_of(self) -> dict[str, int]:
        """Document name -> position (built on first use; the learned stage maps tools here)."""
        return {d.name: i for i, d in enumerate(self.docs)}

    def allowed(self, scope: tuple[str, ...] | None) -> np.ndarray | None:
        """Sorted positions of the documents of `scope`'s servers; None for every server."""
        if scope is None:
            return None
        got = self.scope_cache.get(scope)
        if got is None:
            parts = [self.server_pos[s] for s in scope if s in self.server_pos]
            arr = np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
            got = (arr, None)
            if len(self.scope_cache) < _SCOPE_CACHE_MAX:
                self.scope_cache[scope] = got
        return got[0]

    def allowed_labels(self, scope: tuple[str, ...], allowed: np.ndarray) -> frozenset[int]:
        """The hnsw labels of `allowed` (the positions of `scope`), memoised per scope."""
        got = self.scope_cache.get(scope)
        if got is not None and got[1] is not None:
            return got[1]
        assert self.labels is not None
        labels = frozenset(int(x) for x in self.labels[allowed])
        if len(self.scope_cache) < _SCOPE_CACHE_MAX:
            self.scope_cache[scope] = (allowed, labels)
        return labels


def build_snapshot(
    version: int,
    entries: dict[str, Entry],
    vec_of: dict[bytes, np.ndarray] | None,
    dim: int,
    hnsw: HnswStore | None = None,
) -> Snapshot:
    """The snapshot of `entries` (in their order). Dense parts only when `vec_of` is given
    and every entry is in the dense index; else a bm25-only snapshot. BM25 reads the terms
    in the first entry's vocabulary (an entry of another is encoded again)."""
    ents = list(entries.values())
    docs = tuple(e.doc for e in ents)
    servers = tuple(sorted({d.server for d in docs}))
    sidx = {s: i for i, s in enumerate(servers)}
    doc_server = np.fromiter((sidx[d.server] for d in docs), dtype=np.int64, count=len(docs))
    order = np.argsort(doc_server, kind="stable")
    bounds = np.searchsorted(doc_server[order], np.arange(len(servers) + 1))
    server_pos = {s: order[bounds[i] : bounds[i + 1]] for i, s in enumerate(servers)}
    vocab = ents[0].vocab if ents else Vocab()
    bm25 = Bm25Index.of_terms([in_vocab(e, vocab).terms for e in ents], vocab)
    vecs = labels = centroids = scales = None
    label_pos = np.empty(0, dtype=np.int64)
    if vec_of is not None and ents and all(e.label >= 0 for e in ents):
        compact = COMPACT_ABOVE is not None and len(ents) > COMPACT_ABOVE
        vecs = np.empty((len(ents), dim), dtype=np.int16 if compact else np.float32)
        scales = np.empty(len(ents), dtype=np.float32) if compact else None
        sums = np.zeros((len(servers), dim), dtype=np.float32)
        for s in range(0, len(ents), rows.CHUNK):  # centroids from the float32 vectors, whatever `vecs` keeps
            chunk = np.stack([vec_of[e.key] for e in ents[s : s + rows.CHUNK]]).astype(np.float32, copy=False)
            if scales is None:
                vecs[s : s + chunk.shape[0]] = chunk
            else:
                vecs[s : s + chunk.shape[0]], scales[s : s + chunk.shape[0]] = rows.quantize(chunk)
            np.add.at(sums, doc_server[s : s + chunk.shape[0]], chunk)
        labels = np.fromiter((e.label for e in ents), dtype=np.int64, count=len(ents))
        # an array, not a dict: 0.8 MB at 100,000 tools against ~11 MB of int objects and table
        label_pos = np.full(int(labels.max()) + 1, -1, dtype=np.int64)
        label_pos[labels] = np.arange(len(ents), dtype=np.int64)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        centroids = sums / norms
    return Snapshot(
        version=version,
        docs=docs,
        servers=servers,
        server_pos=server_pos,
        doc_server=doc_server,
        bm25=bm25,
        vecs=vecs,
        labels=labels,
        label_pos=label_pos,
        centroids=centroids,
        hnsw=hnsw if vecs is not None else None,
        scales=scales,
    )


def plan_update(
    entries: dict[str, Entry], upserts: Sequence[ToolDoc], removes: Sequence[str], vocab: Vocab
) -> tuple[dict[str, Entry], list[int]]:
    """The entries after a change, and the hnsw labels it makes stale. `entries` is not
    modified (`vocab`, where new entries put their terms, may gain words). An upserted
    document whose text is unchanged keeps its label (no embedding, no hnsw write); a
    changed one is re-embedded and its old label goes stale."""
    entries = dict(entries)
    stale: list[int] = []
    for name in removes:
        old = entries.pop(name, None)
        if old is not None and old.label >= 0:
            stale.append(old.label)
    for doc in upserts:
        new = make_entry(doc, vocab)
        old = entries.get(doc.name)
        if old is not None and old.label >= 0:
            if old.key == new.key:
                new = dataclasses.replace(new, label=old.label)
            else:
                stale.append(old.label)
        entries[doc.name] = new
    return entries, stale


class IndexBuilder:
    """Entries, embedding cache and hnswlib store across versions; `commit` makes a snapshot.

    `counts` is the engine's counter table (embeddings_computed, embeddings_cached,
    embeddings_shared). With `shared` set, a vector missing here is looked up in the shared
    cache before it is embedded, and one embedded here is published to it."""

    def __init__(self, counts: dict[str, int]) -> None:
        self._entries: dict[str, Entry] = {}
        self.vocab = Vocab()  # the BM25 term ids of `entries`
        self.vec_of: dict[bytes, np.ndarray] = {}  # sha256 of a document text -> its vector
        self.vec_dirty = False  # vec_of holds vectors not yet on disk
        self.hnsw: HnswStore | None = None  # created with the first vectors
        self.shared: SharedVectors | None = None
        self.timings: dict[str, float] = {}  # shared_fetch_s: seconds spent fetching shared vectors
        self.deferred: tuple[np.ndarray, np.ndarray] | None = None  # (vectors, labels) not in hnswlib yet
        self._counts = counts
        self._queue: list[Entry] = []  # entries waiting for a vector, longest first (see pending)
        self._queue_for: dict[str, Entry] | None = None  # the entries dict `_queue` was made from
        self._mat: np.ndarray | None = None  # the float32 snapshot matrix live cache entries view

    @property
    def entries(self) -> dict[str, Entry]:
        return self._entries

    @entries.setter
    def entries(self, entries: dict[str, Entry]) -> None:
        # the queue goes with its dict (kept, it held the old one alive: ~11 MB at 100,000 tools)
        self._entries, self._queue, self._queue_for = entries, [], None

    def fetch_shared(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        """Vectors of `keys` another replica embedded ({} without a shared cache). Does not
        touch the builder: call it outside the engine's lock, then `add_shared`."""
        shared = self.shared
        if shared is None or not keys:
            return {}
        t0 = time.perf_counter()
        try:
            return shared.fetch(keys)
        finally:
            self.timings["shared_fetch_s"] = self.timings.get("shared_fetch_s", 0.0) + time.perf_counter() - t0

    def add_shared(self, found: dict[bytes, np.ndarray]) -> None:
        """Vectors from the shared cache into this one (counted as embeddings_shared)."""
        if found:
            self.vec_of.update(found)
            self.vec_dirty = True
            self._counts["embeddings_shared"] += len(found)

    def publish_shared(self, keys: Sequence[bytes], vecs: np.ndarray) -> None:
        if self.shared is not None and len(keys):
            self.shared.publish(dict(zip(keys, vecs)))

    def seed(self, docs: Sequence[ToolDoc], vectors: np.ndarray) -> None:
        """Put precomputed vectors for `docs` into the embedding cache."""
        if vectors.shape[0] != len(docs):
            raise ValueError(f"{len(docs)} docs but {vectors.shape[0]} vectors")
        for doc, vec in zip(docs, np.asarray(vectors, dtype=np.float32)):
            self.vec_of[doc_key(doc)] = vec
        self.vec_dirty = True

    def pending(self, limit: int) -> dict[bytes, str]:
        """Up to `limit` texts (by key) of entries with neither a label nor a cached vector,
        shortest first. The embedder pads a batch to its longest text, so batches of texts
        of about one length waste the least (the 2,000-tool bench catalog: 121,867 tokens
        padded for 115,637 real ones, against 133,196 in catalog order; bench/README.md
        "Stop 29"). Character length stands in for token count: the builder has no tokenizer.

        The order is made once per entries dict (a commit replaces it) and kept as a list,
        longest first; texts that got a vector since are dropped from its end, so a call
        costs about `limit`, not a scan of every entry."""
        queue = self._queue
        if self._queue_for is not self.entries:
            waiting = {e.key: e for e in self.entries.values() if e.label < 0 and e.key not in self.vec_of}
            queue = self._queue = sorted(waiting.values(), key=lambda e: len(e.text), reverse=True)
            self._queue_for = self.entries
        while queue and queue[-1].key in self.vec_of:
            queue.pop()
        todo: dict[bytes, str] = {}
        for e in reversed(queue):
            if len(todo) >= limit:
                break
            if e.key not in self.vec_of:
                todo[e.key] = e.text
        return todo

    def add_vectors(self, keys: Sequence[bytes], vecs: np.ndarray) -> None:
        """Vectors embedded elsewhere (the background worker) into the embedding cache."""
        for k, v in zip(keys, vecs):
            self.vec_of[k] = v
        self.vec_dirty = True
        self._counts["embeddings_computed"] += len(keys)

    def embedded(self) -> tuple[int, int]:
        """(entries that have a vector, entries)."""
        ents = self.entries.values()
        return sum(1 for e in ents if e.label >= 0 or e.key in self.vec_of), len(ents)

    def commit(
        self, entries: dict[str, Entry], stale: list[int], version: int, emb: Embedder | None, dim: int = 0,
        *, defer_graph: bool = False,
    ) -> tuple[Snapshot, Exception | None]:
        """Embed what is missing (with `emb`; None embeds nothing), insert, then delete, then
        build the snapshot of `entries`: dense when every entry has a label (`dim` > 0).
        `defer_graph`: the new vectors get their labels but go into hnswlib only at
        `insert_deferred` (for a snapshot no search reads through hnswlib: rank.HNSW_MIN).

        Returns it with the embedder's failure, if it failed: the snapshot is then bm25-only
        unless every entry already had a label, and the caller stops using that embedder.
        `entries` becomes the builder's entries."""
        failure: Exception | None = None
        if emb is not None:
            need = [name for name, e in entries.items() if e.label < 0]
            if need:
                try:
                    self._embed_missing(emb, [entries[n] for n in need])
                except Exception as exc:  # noqa: BLE001 - the embedder died: degrade
                    failure = exc
                    emb = None
            if emb is not None and need:
                from toolatlas.retrieval.hnsw import HnswStore, principal_basis

                vecs = np.stack([self.vec_of[entries[n].key] for n in need]).astype(np.float32, copy=False)
                fresh = self.hnsw is None
                if self.hnsw is None:
                    basis = principal_basis(vecs, PROJECT_DIMS) if len(entries) >= PROJECT_MIN else None
                    self.hnsw = HnswStore(emb.dim, capacity=max(1024, 2 * len(entries)), basis=basis)
                if defer_graph:
                    labels = self.hnsw.reserve(len(need))
                    self.deferred = (vecs, labels)
                else:
                    labels = self.hnsw.add(vecs)  # insert first ...
                    if fresh:
                        self.hnsw.settle()
                for name, label in zip(need, labels):
                    entries[name] = dataclasses.replace(entries[name], label=int(label))
        if self.hnsw is not None and stale:
            self.hnsw.delete(stale)  # ... then delete
        if self.hnsw is not None and (
            (self.hnsw.basis is None and len(entries) >= PROJECT_MIN) or self.hnsw.drifted(BASIS_SLACK)
        ):
            self._rebase(entries)
        dim = emb.dim if emb is not None else dim
        snap = build_snapshot(version, entries, self.vec_of if dim else None, dim, self.hnsw)
        self.entries = entries
        if snap.vecs is not None:
            self._share(snap)
        if len(self.vocab) > VOCAB_RENEW_MIN and len(self.vocab) > 2 * snap.bm25.live_terms:
            self.renew_vocab()
        return snap, failure

    def renew_vocab(self) -> None:
        """Encode every entry's terms in a new vocabulary holding only their words; the
        published snapshots keep the old one, theirs."""
        vocab = Vocab()
        self.entries = {name: in_vocab(e, vocab) for name, e in self.entries.items()}
        self.vocab = vocab

    def _rebase(self, entries: dict[str, Entry]) -> None:
        """A store that grew past PROJECT_MIN (or was written before stores had a basis), or
        whose basis no longer fits what was inserted since (HnswStore.drifted), is built
        again in the principal basis of its live vectors, their labels kept; published
        snapshots keep searching the old one. Vectors left out by `defer_graph` go in too."""
        assert self.hnsw is not None
        live = [e for e in entries.values() if e.label >= 0]
        if not live or any(e.key not in self.vec_of for e in live):
            return  # not every live vector at hand: stay as it is
        from toolatlas.retrieval.hnsw import principal_basis

        t0 = time.perf_counter()
        vecs = np.stack([self.vec_of[e.key] for e in live]).astype(np.float32, copy=False)
        labels = np.fromiter((e.label for e in live), dtype=np.int64, count=len(live))
        self.hnsw = self.hnsw.rebased(principal_basis(vecs, PROJECT_DIMS), vecs, labels)
        self.deferred = None
        self.timings["hnsw_rebase_s"] = time.perf_counter() - t0
        log.info("retrieval.hnsw_rebased vectors=%d dims=%d seconds=%.2f", len(live), PROJECT_DIMS,
                 self.timings["hnsw_rebase_s"])

    def insert_deferred(self) -> None:
        """Insert the vectors a `commit(defer_graph=True)` left out of hnswlib."""
        if self.deferred is not None and self.hnsw is not None:
            self.hnsw.insert(*self.deferred)
        self.deferred = None

    def _share(self, snap: Snapshot) -> None:
        """Keep one copy of each live vector in memory. Under a float32 snapshot the cache's
        entry for a live document becomes a row of the snapshot's matrix (a view), so the
        cache no longer holds its own array beside it. Under an int16 one the cache keeps
        the float32 original (the file's view, or a heap array until `remap` maps it after
        the next write): the snapshot's rows are rounded, and the file must stay exact. A
        cached vector no longer live that still views an older matrix is copied out, so that
        matrix can go; one that views the mapped embedding file stays a view (page cache, not
        heap: see persist.load_embeddings). Live keys move to the end of the cache's order,
        which is its recency order (store.vectors_to_keep)."""
        assert snap.vecs is not None
        live: dict[bytes, int] = {}
        for i, e in enumerate(self.entries.values()):
            live.setdefault(e.key, i)
        vec_of, mat = self.vec_of, snap.vecs
        exact = mat.dtype == np.float32
        for key, vec in vec_of.items():
            if vec.base is None or persist.is_mapped(vec):
                continue
            if key not in live or (not exact and vec.base is self._mat):
                vec_of[key] = vec.copy()
        for key, i in live.items():
            vec = vec_of.pop(key)
            vec_of[key] = mat[i] if exact else vec
        self._mat = mat if exact else None

    def remap(self, on_disk: dict[bytes, np.ndarray]) -> None:
        """The embedding cache was written: `on_disk` is what the file holds, as views of it.
        A vector no longer live is replaced by its view of the file (its heap copy goes) or,
        if the file no longer keeps it, dropped; so the heap holds only live vectors and
        those not written yet, and the file (bounded, store.vectors_to_keep) the rest. Under
        a compact (int16) snapshot the live vectors become views of the file too (see `_share`)."""
        live = {e.key for e in self.entries.values()}
        for key in list(self.vec_of):
            if key in live and self._mat is not None:
                continue  # a row of the float32 snapshot
            got = on_disk.get(key)
            if got is not None:
                self.vec_of[key] = got
            elif key not in live:
                del self.vec_of[key]

    def _embed_missing(self, emb: Embedder, ents: Sequence[Entry]) -> None:
        missing: dict[bytes, str] = {}
        for e in ents:
            if e.key in self.vec_of:
                self._counts["embeddings_cached"] += 1
            elif e.key not in missing:
                missing[e.key] = e.text
        if not missing:
            return
        found = self.fetch_shared(list(missing))
        self.add_shared(found)
        keys = sorted((k for k in missing if k not in found), key=lambda k: len(missing[k]))  # see pending
        for s in range(0, len(keys), EMBED_BATCH):
            chunk = keys[s : s + EMBED_BATCH]
            vecs = emb.embed([missing[k] for k in chunk])
            for k, v in zip(chunk, vecs):
                self.vec_of[k] = v
            self.publish_shared(chunk, vecs)
        self._counts["embeddings_computed"] += len(keys)
        self.vec_dirty = True
