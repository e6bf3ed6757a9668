"""The retrieval engine: the one facade the daemon and `toolatlas eval` call.

Each tool becomes a structured document (documents.py), indexed twice: BM25 over
field-weighted tokens and MiniLM embeddings in hnswlib (index.py). A search fuses both
branches (normalised-score fusion by default, RRF as the baseline), optionally after a
server-centroid first stage (two-stage mode), always inside the caller's scope (rank.py).
The index survives restarts (store.py).

Concurrency: `update()` is serialised by a lock, runs in a worker thread, embeds only texts
missing from the embedding cache, inserts new vectors before deleting old ones, and publishes
a new immutable `Snapshot` with one attribute assignment. `search()` reads whichever snapshot
is current when it starts; it never sees a half-built one. Both block: call them from worker
threads, never on the event loop.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolatlas.retrieval import rank, store
from toolatlas.retrieval.cache import TtlLru
from toolatlas.retrieval.documents import FIELD_WEIGHTS, Entry, ToolDoc, make_entry
from toolatlas.retrieval.embed import QUERY_THREADS, Embedder, limit_blas_threads
from toolatlas.retrieval.index import IndexBuilder, Snapshot, plan_update
from toolatlas.retrieval.rank import DENSE_MODES, FUSION, FUSIONS, MODES
from toolatlas.retrieval.text import normalise_query

__all__ = [
    "DENSE_MODES", "FIELD_WEIGHTS", "FUSION", "FUSIONS", "MODES", "Engine", "Hit", "SearchOutcome", "ToolDoc",
    "make_entry",
]

log = logging.getLogger(__name__)

CacheKey = tuple[str, int, tuple[str, ...] | None, int, str]
# what stats() counts, in the order it reports them
COUNTERS = (
    "embeddings_computed", "embeddings_cached", "embedder_failures", "degraded_searches", "searches", "updates",
    "persist_failures", "cache_corrupt", "snapshot_restored",
)


@dataclass(frozen=True)
class Hit:
    name: str
    server: str
    score: float


@dataclass(frozen=True)
class SearchOutcome:
    hits: list[Hit]
    degraded: str | None
    cached: bool
    mode: str
    version: int


class Engine:
    """Hybrid tool retrieval over a changing catalog. See the module docstring."""

    def __init__(
        self,
        *,
        state_dir: Path | None,
        mode: str = "hybrid",
        embedder: str = "onnx",
        cache_size: int = 1024,
        cache_ttl: float = 300.0,
        persist: bool = True,
        fusion: str = FUSION,
        query_threads: int = QUERY_THREADS,
    ) -> None:
        """`persist=False` keeps state_dir for the model export only (no index files);
        `fusion` picks the hybrid ranker ("z" default, "minmax", "rrf" baseline);
        `query_threads`: threads for a query embedded while no other is (embed.OnnxEmbedder).
        Limits numpy's BLAS to one thread in this process (embed.limit_blas_threads)."""
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r}; expected one of {', '.join(FUSIONS)}")
        self.fusion = fusion
        limit_blas_threads()
        if mode not in MODES:
            raise ValueError(f"unknown search mode {mode!r}; expected one of {', '.join(MODES)}")
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.mode = mode
        self.embedder_kind = embedder
        self.query_threads = query_threads
        self.persist = persist
        self._embedder: Embedder | None = None
        self._embedder_error: str | None = None
        self._loaded = False
        self._load_lock = threading.Lock()
        self._update_lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._cache: TtlLru[SearchOutcome] = TtlLru(cache_size, cache_ttl)
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._qvecs = QueryVectors(self._counts)
        self._index = IndexBuilder(self._counts)
        self._timings: dict[str, float] = {}
        self._persisted_version = 0  # the catalog version whose snapshot is on disk

    # -- properties -----------------------------------------------------------------------

    @property
    def version(self) -> int:
        snap = self._snap
        return snap.version if snap is not None else 0

    @property
    def ready(self) -> bool:
        return self._snap is not None

    def __len__(self) -> int:
        snap = self._snap
        return snap.n if snap is not None else 0

    @property
    def degraded(self) -> str | None:
        """"bm25-only" when the embedder was wanted but failed; None otherwise."""
        if self.embedder_kind == "none":
            return None
        return "bm25-only" if self._embedder is None and self._loaded else None

    @property
    def embedder(self) -> Embedder | None:
        """The loaded Embedder, or None (bm25-only, or not loaded yet)."""
        return self._embedder

    def catalog_vectors(self) -> tuple[int, tuple[ToolDoc, ...], np.ndarray | None]:
        """(version, documents, their dense vectors or None) of the current snapshot, for
        analyses (Rift) that must not embed the catalog again. Read-only views."""
        snap = self._snap
        if snap is None:
            return 0, (), None
        return snap.version, snap.docs, snap.vecs

    # -- loading and updates --------------------------------------------------------------

    def load(self) -> None:
        """Load the embedder (failure: logged, counted, bm25-only) and any persisted state."""
        with self._load_lock:
            if self._loaded:
                return
            t0 = time.perf_counter()
            if self.embedder_kind != "none":
                self._embedder, self._embedder_error = _load_embedder(self.embedder_kind, self.state_dir, self.query_threads)
                if self._embedder is None:
                    self._counts["embedder_failures"] += 1
            self._timings["embedder_load_s"] = time.perf_counter() - t0
            if self.state_dir is not None and self.persist:
                self._restore(self.state_dir)
            self._timings["load_s"] = time.perf_counter() - t0
            # last: update() waits on _load_lock until the restored snapshot is in place
            self._loaded = True

    def _restore(self, state_dir: Path) -> None:
        emb = self._embedder
        disk = store.read(state_dir, emb)
        self._counts["cache_corrupt"] += disk.corrupt
        if disk.vec_of is not None:
            self._index.vec_of = disk.vec_of
        if disk.vectors_corrupt:
            self._index.vec_dirty = True
        restored = disk.snapshot
        if restored is None:
            return
        with self._update_lock:
            if self._snap is not None:  # a live catalog got here first: it wins
                return
            revived = store.revive(restored, self._index.vec_of, emb)
            self._counts["cache_corrupt"] += revived.corrupt
            self._index.hnsw = revived.hnsw
            hnsw_ok = revived.hnsw is not None
            self._commit(revived.entries, [], restored.version, persist_now=not hnsw_ok)
            if hnsw_ok:
                self._persisted_version = restored.version
            self._counts["snapshot_restored"] += 1
            log.info("retrieval.snapshot_restored tools=%d version=%d", len(revived.entries), restored.version)

    def update(self, upserts: Sequence[ToolDoc], removes: Sequence[str]) -> int:
        """Apply a catalog change; returns the new catalog version. Blocking, serialised."""
        if not self._loaded:
            self.load()
        with self._update_lock:
            t0 = time.perf_counter()
            entries, stale = plan_update(self._index.entries, upserts, removes)
            version = self.version + 1
            self._commit(entries, stale, version)
            self._counts["updates"] += 1
            self._timings["last_update_s"] = time.perf_counter() - t0
            return version

    def seed_embeddings(self, docs: Sequence[ToolDoc], vectors: np.ndarray) -> None:
        """Put precomputed document vectors into the embedding cache (benchmarks, imports).

        `vectors` must be (len(docs), dim), L2-normalised, from the same model; a later
        `update()` with these docs then embeds none of them.
        """
        with self._update_lock:
            self._index.seed(docs, vectors)

    def _commit(self, entries: dict[str, Entry], stale: list[int], version: int, persist_now: bool = True) -> None:
        """Embed what is missing, insert, then delete, then publish. Holds _update_lock."""
        snap, failure = self._index.commit(entries, stale, version, self._embedder)
        if failure is not None:
            self._counts["embedder_failures"] += 1
            self._embedder = None
            self._embedder_error = str(failure)
            log.error("retrieval.embedder_failed during update: %s; searching bm25-only", failure)
        self._snap = snap  # the atomic publish
        self._cache.clear()
        if persist_now and self.persist and self.state_dir is not None:
            if store.write(self.state_dir, self._embedder, self._index, snap):
                self._persisted_version = snap.version
            else:
                self._counts["persist_failures"] += 1

    # -- search ---------------------------------------------------------------------------

    def search(
        self,
        query: str,
        top_k: int = 5,
        *,
        servers: Collection[str] | None = None,
        mode: str | None = None,
    ) -> SearchOutcome:
        """Rank tools for `query` within `servers` (None: all). Blocking, thread-safe."""
        mode = mode or self.mode
        if mode not in MODES:
            raise ValueError(f"unknown search mode {mode!r}; expected one of {', '.join(MODES)}")
        snap = self._snap
        if snap is None:
            return SearchOutcome(hits=[], degraded="no-index", cached=False, mode=mode, version=0)
        top_k = max(1, int(top_k))
        key = _cache_key(query, top_k, servers, snap, mode)
        scope = key[2]  # the sorted server names, or None for every server
        hit = self._cache.get(key)
        if hit is not None:
            return dataclasses.replace(hit, cached=True)
        self._counts["searches"] += 1
        allowed = snap.allowed(scope)
        degraded: str | None = None
        if allowed is not None and allowed.shape[0] == 0:
            positions, scores = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        else:
            qvec = None
            if mode in DENSE_MODES:
                qvec = self._qvecs.get(self._embedder, query) if snap.vecs is not None else None
                if qvec is None and self.embedder_kind != "none":
                    degraded = "bm25-only"
                    self._counts["degraded_searches"] += 1
            positions, scores = rank.rank(snap, query, qvec, top_k, scope, allowed, mode, self.fusion)
        hits = [Hit(name=snap.docs[p].name, server=snap.docs[p].server, score=float(s)) for p, s in zip(positions, scores)]
        out = SearchOutcome(hits=hits, degraded=degraded, cached=False, mode=mode, version=snap.version)
        if degraded is None or self._embedder is None:
            self._cache.put(key, out)
        return out

    def cached(
        self, query: str, top_k: int = 5, *, servers: Collection[str] | None = None, mode: str | None = None
    ) -> SearchOutcome | None:
        """The result-cache entry `search` would return for these arguments, or None.
        Never blocks (a dict lookup under a short lock), so the event loop can answer a
        repeated query without a thread hop; a None here is not counted as a miss."""
        snap = self._snap
        mode = mode or self.mode
        if snap is None or mode not in MODES:
            return None
        hit = self._cache.get(_cache_key(query, max(1, int(top_k)), servers, snap, mode), count_miss=False)
        return dataclasses.replace(hit, cached=True) if hit is not None else None

    # -- status ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        snap = self._snap
        emb = self._embedder
        hnsw = self._index.hnsw
        return {
            "tools": snap.n if snap is not None else 0,
            "servers": len(snap.servers) if snap is not None else 0,
            "version": snap.version if snap is not None else 0,
            # equal to version once that catalog's snapshot is written (0: none written)
            "persisted_version": self._persisted_version,
            "mode": self.mode,
            "fusion": self.fusion,
            "embedder": emb.name if emb is not None else self.embedder_kind,
            "query_embedder": emb.query_name if emb is not None else None,
            # threads a lone query runs on, and how many queries did (embed.OnnxEmbedder)
            "query_threads": getattr(emb, "query_threads", 1) if emb is not None else None,
            "lone_queries": getattr(emb, "lone_queries", 0) if emb is not None else None,
            "embedder_error": self._embedder_error,
            "degraded": self.degraded,
            "dense_index": {"live": hnsw.live, "deleted_slots": hnsw.deleted} if hnsw is not None else None,
            "cache": {"hits": self._cache.hits, "misses": self._cache.misses, "size": len(self._cache)},
            **self._counts,
            "timings": {k: round(v, 4) for k, v in self._timings.items()},
        }


def _load_embedder(kind: str, state_dir: Path | None, query_threads: int) -> tuple[Embedder | None, str | None]:
    """(the embedder, None), or (None, why) after logging it: a failure means bm25-only."""
    from toolatlas.retrieval.embed import get_embedder

    try:
        return get_embedder(kind, state_dir, query_threads), None
    except Exception as exc:  # noqa: BLE001 - any failure degrades, never crashes
        log.error("retrieval.embedder_failed kind=%s error=%s; searching bm25-only", kind, exc)
        return None, str(exc)


class QueryVectors:
    """Query vectors by (query embedder, stripped query), LRU-bounded; a failure to embed
    is counted and logged, and that search runs bm25-only."""

    def __init__(self, counts: dict[str, int], size: int = 512) -> None:
        self._lru: TtlLru[np.ndarray] = TtlLru(size, 0)
        self._counts = counts

    def get(self, emb: Embedder | None, query: str) -> np.ndarray | None:
        if emb is None:
            return None
        q = query.strip()
        key = (emb.query_name, q)
        vec = self._lru.get(key)
        if vec is None:
            try:
                vec = emb.embed_queries([q])[0]
            except Exception as exc:  # noqa: BLE001 - degrade this search, keep serving
                self._counts["embedder_failures"] += 1
                log.warning("retrieval.query_embed_failed error=%s; this search is bm25-only", exc)
                return None
            self._lru.put(key, vec)
        return vec


def _cache_key(
    query: str, top_k: int, servers: Collection[str] | str | None, snap: Snapshot, mode: str
) -> CacheKey:
    """The result-cache key of one search: (normalised query, top_k, scope, version, mode);
    the scope is None (every server) or the sorted server names."""
    if isinstance(servers, str):
        servers = [servers]
    scope = None if servers is None else tuple(sorted(set(servers)))
    return (normalise_query(query), top_k, scope, snap.version, mode)
