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

Starting (warmup.py): `load()` does everything at once (eval, benches). The daemon's engine
(`background=True`) instead `restore()`s the persisted index (no model needed), serves BM25
at once, and brings the dense branch in from a worker thread: `load_model()` (exporting the
ONNX model first on a fresh state_dir), then `embed_pending()` batch by batch outside the
update lock, then one publish of the hybrid snapshot. Its `update()` embeds a small change
inline once the model is ready and leaves a large one (or any, before) to that worker.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolatlas.retrieval import rank, store
from toolatlas.retrieval.cache import QueryVectors, TtlLru, text_key
from toolatlas.retrieval.documents import FIELD_WEIGHTS, Entry, ToolDoc
from toolatlas.retrieval.embed import DIM, QUERY_THREADS, Embedder, document_space, limit_blas_threads
from toolatlas.retrieval.index import EMBED_BATCH, IndexBuilder, Snapshot, plan_update
from toolatlas.retrieval.shared import SharedVectors
from toolatlas.retrieval.learned import LearnedState
from toolatlas.retrieval.warmup import ModelLoader, ModelPhase, ModelProgress
from toolatlas.retrieval.rank import DENSE_MODES, FUSION, FUSIONS, MODES
from toolatlas.retrieval.text import normalise_query

__all__ = [
    "DENSE_MODES", "FIELD_WEIGHTS", "FUSION", "FUSIONS", "INLINE_EMBED_MAX", "MODES", "Engine", "Hit", "ModelPhase",
    "SearchOutcome", "ToolDoc",
]

log = logging.getLogger(__name__)

# A background engine embeds at most this many new documents inside update() (about a second
# on two cores); a larger change is indexed BM25-first and embedded by the background worker.
INLINE_EMBED_MAX = 64

# (normalised query, top_k, scope, index version, mode, learned-state version, principal)
CacheKey = tuple[str | bytes, int, tuple[str, ...] | None, int, str, int, str | None]
# what stats() counts, in the order it reports them
COUNTERS = (
    "embeddings_computed", "embeddings_cached", "embeddings_shared", "embedder_failures", "degraded_searches", "searches", "updates",
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
    # (best cosine, best BM25 coverage) over the searched tools: adaptive.nothing_fits reads
    # it; None without a query vector
    evidence: tuple[float, float] | None = None


class Engine:
    """Hybrid tool retrieval over a changing catalog. See the module docstring."""

    def __init__(
        self, *, state_dir: Path | None, mode: str = "hybrid", embedder: str = "onnx", cache_size: int = 1024,
        cache_ttl: float = 300.0, persist: bool = True, fusion: str = FUSION, query_threads: int = QUERY_THREADS,
        background: bool = False,
    ) -> None:
        """`persist=False` keeps state_dir for the model export only (no index files);
        `fusion` picks the hybrid ranker ("z" default, "minmax", "rrf" baseline);
        `query_threads`: threads for a query embedded while no other is (embed.OnnxEmbedder);
        `background`: the dense branch is brought in by a worker (see the module docstring).
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
        self.persist, self.background = persist, background
        # The document vector space (what caches and snapshots are keyed by); None: no embedder.
        self._space = None if embedder == "none" else document_space(embedder)
        self._dim = 0 if embedder == "none" else DIM
        self._embedder: Embedder | None = None  # searches and inline updates use it: set once hybrid
        self._restored = False
        self._load_lock = threading.Lock()
        self._update_lock = threading.Lock()
        self._snap: Snapshot | None = None
        self.learned: LearnedState | None = None  # see set_learned
        self.learning = False
        self._cache: TtlLru[SearchOutcome] = TtlLru(cache_size, cache_ttl)
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._loader = ModelLoader(embedder, self.state_dir, query_threads, self._counts)
        self._qvecs = QueryVectors(self._counts)
        self._index = IndexBuilder(self._counts)
        self._timings: dict[str, float] = {}
        self._persisted_version, self._writes = 0, store.WriteHealth()  # the version on disk; why writes fail

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
    def degraded(self) -> str | None:  # why dense search is missing (warmup.ModelProgress.degraded), or None
        return self._loader.progress.degraded

    @property
    def progress(self) -> ModelProgress:
        """The dense branch's phase and embedding progress (warmup.py)."""
        return self._loader.progress

    @property
    def space(self) -> str | None:  # the vector space of queries and documents (None: no embedder)
        return self._space

    @property
    def embedder(self) -> Embedder | None:  # the loaded Embedder, or None (bm25-only, or not loaded yet)
        return self._embedder

    def catalog_vectors(self) -> tuple[int, tuple[ToolDoc, ...], np.ndarray | None]:
        """(version, documents, float32 dense vectors or None) of the current snapshot, for
        analyses (Rift) that must not embed the catalog again. Read-only."""
        snap = self._snap
        return (0, (), None) if snap is None else (snap.version, snap.docs, snap.rows() if snap.vecs is not None else None)

    # -- loading and updates --------------------------------------------------------------

    def load(self) -> None:
        """Everything, blocking: the persisted index, the embedder (exported first if needed;
        a failure is logged, counted, and leaves BM25 only) and the vectors the index lacks."""
        self.restore()
        if self.load_model() is not None:
            while self.embed_pending():
                pass

    def restore(self) -> None:
        """Load the persisted index and embedding cache; no model needed (they are keyed by the
        vector space, known from the kind). Idempotent."""
        with self._load_lock:
            if self._restored:
                return
            t0 = time.perf_counter()
            if self.state_dir is not None and self.persist:
                self._restore(self.state_dir)
            self._timings["load_s"] = time.perf_counter() - t0
            # last: update() waits on _load_lock until the restored snapshot is in place
            self._restored = True

    def load_model(self) -> Embedder | None:
        """Load the embedder, exporting the ONNX model first on a fresh state_dir (warmup.py);
        None for "none" or after a failure (BM25 only). Idempotent. Blocking."""
        model = self._loader.load()
        self._timings["embedder_load_s"] = self._loader.seconds
        return model

    def export_ahead(self) -> None:  # only the ONNX export, now (warmup.ModelLoader.export_ahead)
        self._loader.export_ahead()

    def cancel(self) -> None:
        self._loader.cancel()  # a running export is killed, no further batch starts

    def _fail(self, exc: BaseException, during: str) -> None:
        self._embedder = None
        self._loader.fail(exc, during)

    def embed_pending(self) -> bool:
        """One step towards hybrid search (warmup.ModelLoader.embed_step): a batch of
        documents embedded outside the update lock, or the hybrid snapshot published. True
        while there is more to do. Blocking; a worker thread calls it in a loop."""
        return self._loader.embed_step(self._update_lock, self._index, functools.partial(_publish_hybrid, self),
                                       self._fail)

    def _restore(self, state_dir: Path) -> None:
        with self._update_lock:
            if self._snap is not None:  # a live catalog got here first: it wins
                return
            got = store.restore(state_dir, self._space, self._dim, self._index)
            self._counts["cache_corrupt"] += got.corrupt
            if got.entries is None:
                return
            self._commit(got.entries, [], got.version, persist_now=not got.hnsw_ok)
            if got.hnsw_ok:
                self._persisted_version = got.version
            self._counts["snapshot_restored"] += 1
            log.info("retrieval.snapshot_restored tools=%d version=%d", len(got.entries), got.version)

    def update(self, upserts: Sequence[ToolDoc], removes: Sequence[str]) -> int:
        """Apply a catalog change; returns the new catalog version. Blocking, serialised.
        A background engine embeds the change here only when the model is ready and the
        change small (INLINE_EMBED_MAX); otherwise its documents are searchable by BM25 at
        once and the background worker embeds them (`progress.pending`)."""
        if not self._restored:
            self.restore() if self.background else self.load()
        with self._update_lock:
            t0 = time.perf_counter()
            entries, stale = plan_update(self._index.entries, upserts, removes, self._index.vocab)
            version = self.version + 1
            inline = True
            if self.background and self.embedder_kind != "none":
                missing = {e.key for e in entries.values() if e.label < 0 and e.key not in self._index.vec_of}
                inline = self._loader.progress.phase is ModelPhase.READY and len(missing) <= INLINE_EMBED_MAX
            self._commit(entries, stale, version, embed=inline)
            if not inline and self._loader.model is not None:
                self._loader.note(self._index)  # back to "embedding": the worker takes it
            self._counts["updates"] += 1
            self._timings["last_update_s"] = time.perf_counter() - t0
            return version

    def share_vectors(self, shared: SharedVectors | None) -> None:
        """Use an embedding cache shared with other replicas (retrieval/shared.py); None: this process's only."""
        self._index.shared = shared

    @property
    def shares_vectors(self) -> bool:  # an embedding cache shared with other replicas is plugged in
        return self._index.shared is not None

    def seed_embeddings(self, docs: Sequence[ToolDoc], vectors: np.ndarray) -> None:
        """Put precomputed document vectors into the embedding cache (benchmarks, imports):
        (len(docs), dim), L2-normalised, same model; `update()` then embeds none of them."""
        with self._update_lock:
            self._index.seed(docs, vectors)

    def _commit(self, entries: dict[str, Entry], stale: list[int], version: int, persist_now: bool = True,
                embed: bool = True, defer_graph: bool = False) -> None:
        """Embed what is missing (unless `embed` is False), insert, then delete, then
        publish. Holds _update_lock. `defer_graph`: see IndexBuilder.commit (the caller
        inserts and persists after). A store the commit built again on principal coordinates
        (index.PROJECT_MIN) is written at once, so a restart loads it instead of rebuilding."""
        before = self._index.hnsw
        snap, failure = self._index.commit(entries, stale, version, self._embedder if embed else None, self._dim,
                                           defer_graph=defer_graph)
        if failure is not None:
            self._fail(failure, "update")
        self._snap = snap  # the atomic publish
        self._cache.clear()
        rebuilt = before is not None and self._index.hnsw is not before
        _persist(self, snap, (persist_now or rebuilt) and not defer_graph)

    def set_learned(self, state: LearnedState | None) -> None:
        """Publish the learned stage's state (one assignment): for "learned" searches, and "hybrid" ones while `learning` is set."""
        self.learned = state
        self._cache.clear()

    def search(self, query: str, top_k: int = 5, *, servers: Collection[str] | None = None, mode: str | None = None,
               principal: str | None = None, internal: bool = False) -> SearchOutcome:
        """Rank tools for `query` within `servers` (None: all) as `principal` (whose own usage
        events count in full in the learned stage) sees them. `internal` (the token counter's
        sample queries): the result cache and the counters are left to clients' searches, which
        catalog_status and the metrics count. Blocking, thread-safe."""
        mode = mode or self.mode
        if mode not in MODES:
            raise ValueError(f"unknown search mode {mode!r}; expected one of {', '.join(MODES)}")
        snap = self._snap
        if snap is None:
            return SearchOutcome(hits=[], degraded="no-index", cached=False, mode=mode, version=0)
        top_k = max(1, int(top_k))
        state = self.learned
        ranker = _ranker(self, mode)
        key = _cache_key(query, top_k, servers, snap, ranker, state, principal)
        scope = key[2]  # the sorted server names, or None for every server
        hit = None if internal else self._cache.get(key)
        if hit is not None:
            return hit
        positions, scores, degraded, evidence = _rank_once(self, snap, query, top_k, scope, mode, ranker, state, principal)
        self._counts["searches"] += not internal
        self._counts["degraded_searches"] += degraded is not None and not internal
        hits = [Hit(name=snap.docs[p].name, server=snap.docs[p].server, score=float(s)) for p, s in zip(positions, scores)]
        out = SearchOutcome(hits=hits, degraded=degraded, cached=False, mode=mode, version=snap.version,
                            evidence=evidence)
        # A BM25 answer for want of a model that is still coming is not kept. The cache
        # holds it as a hit returns it (one copy per miss, not one per hit).
        if not internal and (degraded is None or self._loader.progress.phase is ModelPhase.FAILED):
            self._cache.put(key, dataclasses.replace(out, cached=True))
        return out

    def cached(self, query: str, top_k: int = 5, *, servers: Collection[str] | None = None, mode: str | None = None,
               principal: str | None = None) -> SearchOutcome | None:
        """The result-cache entry `search` would return for these arguments, or None.
        Never blocks (a dict lookup under a short lock), so the event loop can answer a
        repeated query without a thread hop; a None here is not counted as a miss."""
        snap = self._snap
        mode = mode or self.mode
        if snap is None or mode not in MODES:
            return None
        key = _cache_key(query, max(1, int(top_k)), servers, snap, _ranker(self, mode), self.learned, principal)
        return self._cache.get(key, count_miss=False)

    def stats(self) -> dict[str, Any]:
        """Figures for catalog_status (index.*): sizes, embedder, the model's progress, counters."""
        return _stats(self, self._snap, self._embedder)


def _publish_hybrid(eng: Engine, model: Embedder) -> None:
    """Every document has a vector: insert the missing ones, publish (the caller holds
    eng._update_lock). A catalog below rank.HNSW_MIN tools whose snapshot so far was BM25
    only is searched by an exact scan, never through hnswlib: it is published (hybrid from
    then on) before its vectors go into the graph, and persisted after."""
    entries = eng._index.entries
    snap = eng._snap
    eng._embedder = model
    defer = False
    if entries and (snap is None or snap.vecs is None or any(e.label < 0 for e in entries.values())):
        t0 = time.perf_counter()
        defer = len(entries) < rank.HNSW_MIN and (snap is None or snap.vecs is None)
        eng._commit(dict(entries), [], eng.version + 1, defer_graph=defer)
        eng._timings["hybrid_commit_s"] = time.perf_counter() - t0
    else:
        eng._cache.clear()  # answers cached while the model loaded were BM25's
    if eng._embedder is not None:  # _commit may have failed it
        n = len(entries)
        eng._loader.ready(n)
        log.info("retrieval.hybrid_ready tools=%d version=%d", n, eng.version)
    if defer:
        t0 = time.perf_counter()
        eng._index.insert_deferred()
        eng._timings["hnsw_after_ready_s"] = time.perf_counter() - t0
        if eng._snap is not None:
            _persist(eng, eng._snap, True)


def _persist(eng: Engine, snap: Snapshot, now: bool) -> None:
    """Write `snap` (and what changed of the embedding cache) when `now` and persisting."""
    if not (now and eng.persist and eng.state_dir is not None):
        store.release_pages()  # the vectors the snapshot read from the mapped file
    elif store.write(eng.state_dir, eng._space, eng._index, snap, eng._timings, eng._writes):
        eng._persisted_version = snap.version
    else:
        eng._counts["persist_failures"] += 1


def _ranker(eng: Engine, mode: str) -> str:
    """The ranker a search in `mode` runs: the daemon's "hybrid" is "learned" while learning is on."""
    return "learned" if mode == "hybrid" and eng.learning else mode


def _rank_once(
    eng: Engine, snap: Snapshot, query: str, top_k: int, scope: tuple[str, ...] | None, mode: str, ranker: str,
    state: LearnedState | None, principal: str | None,
) -> tuple[np.ndarray, np.ndarray, str | None, tuple[float, float] | None]:
    """(positions, scores, why degraded or None, evidence) of one uncached search."""
    allowed = snap.allowed(scope)
    if allowed is not None and allowed.shape[0] == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32), None, None
    degraded: str | None = None
    qvec = None
    if mode in DENSE_MODES:
        qvec = eng._qvecs.get(eng._embedder, query) if snap.vecs is not None else None
        if qvec is None and eng.embedder_kind != "none":
            degraded = eng._loader.progress.degraded or "bm25-only"
    qs = rank.QueryScores(snap, query, qvec, allowed)
    positions, scores = rank.rank(qs, top_k, scope, ranker, eng.fusion, state=state, principal=principal)
    return positions, scores, degraded, rank.evidence(qs, scope, ranker, state, principal)


def query_vectors(eng: Engine, queries: Sequence[str]) -> np.ndarray | None:
    """Query vectors (normalised, rows in order) for the learned stage's events, or None
    while `eng` has no embedder loaded (or it fails). Blocking."""
    emb = eng.embedder
    if emb is None or not queries:
        return None
    try:
        return np.asarray(emb.embed_queries([q.strip() for q in queries]), dtype=np.float32)
    except Exception as exc:  # noqa: BLE001 - the events wait for a working embedder
        eng._counts["embedder_failures"] += 1
        log.warning("retrieval.query_embed_failed error=%s; usage events wait for their vectors", exc)
        return None


def _stats(eng: Engine, snap: Snapshot | None, emb: Embedder | None) -> dict[str, Any]:
    hnsw = eng._index.hnsw
    return {
        "tools": snap.n if snap is not None else 0,
        "servers": len(snap.servers) if snap is not None else 0,
        "version": snap.version if snap is not None else 0,
        # equal to version once that catalog's snapshot is written (0: none written)
        "persisted_version": eng._persisted_version,
        "persist_error": eng._writes.error,  # why the last write failed (None: it did not)
        "mode": eng.mode,
        "fusion": eng.fusion,
        "embedder": emb.name if emb is not None else eng.embedder_kind,
        "query_embedder": emb.query_name if emb is not None else None,
        # threads a lone query runs on, and how many queries did (embed.OnnxEmbedder)
        "query_threads": getattr(emb, "query_threads", 1) if emb is not None else None,
        "lone_queries": getattr(emb, "lone_queries", 0) if emb is not None else None,
        "embedder_error": eng._loader.progress.error,
        "degraded": eng.degraded,
        # the dense branch: phase (warmup.ModelPhase), seconds in it, documents embedded of total
        "model": eng._loader.progress.as_dict(),
        "dense_index": {"live": hnsw.live, "deleted_slots": hnsw.deleted} if hnsw is not None else None,
        "cache": {"hits": eng._cache.hits, "misses": eng._cache.misses, "size": len(eng._cache)},
        **eng._counts,
        "timings": {k: round(v, 4) for k, v in (eng._timings | eng._index.timings).items()},
    }


def _cache_key(
    query: str, top_k: int, servers: Collection[str] | str | None, snap: Snapshot, mode: str,
    state: LearnedState | None = None, principal: str | None = None,
) -> CacheKey:
    """The result-cache key of one search: (normalised query, top_k, scope, version, mode,
    and for the learned ranker the state's version and the principal); the scope is None
    (every server, also when `servers` covers all of `snap`'s) or the sorted server names."""
    if isinstance(servers, str):
        servers = [servers]
    scope = None if servers is None else tuple(sorted(set(servers)))
    if scope is not None and len(scope) >= len(snap.servers) and set(snap.servers).issubset(scope):
        scope = None  # every server of this version: unscoped (no position list, no hnswlib filter)
    if mode != "learned" or state is None or state.empty:
        return (text_key(normalise_query(query)), top_k, scope, snap.version, mode, 0, None)
    return (text_key(normalise_query(query)), top_k, scope, snap.version, mode, state.version, principal)
