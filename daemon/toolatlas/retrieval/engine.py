"""The retrieval engine: the one facade the daemon and `toolatlas eval` call.

Each tool becomes a structured document, indexed twice: BM25 over field-weighted tokens and
MiniLM embeddings in hnswlib. A search fuses both branches (normalised-score fusion by
default, RRF as the baseline), optionally after a server-centroid first stage (two-stage
mode), always inside the caller's scope.

Concurrency: `update()` is serialised by a lock, runs in a worker thread, embeds only texts
missing from the embedding cache, inserts new vectors before deleting old ones, and publishes
a new immutable `_Snapshot` with one attribute assignment. `search()` reads whichever snapshot
is current when it starts; it never sees a half-built one. Both block: call them from worker
threads, never on the event loop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from toolatlas.retrieval import fusion, persist
from toolatlas.retrieval.bm25 import Bm25Index
from toolatlas.retrieval.cache import TtlLru
from toolatlas.retrieval.embed import QUERY_THREADS, limit_blas_threads
from toolatlas.retrieval.text import dense_text, lexical_fields, normalise_query, tokenize

log = logging.getLogger(__name__)

MODES = ("hybrid", "bm25", "dense", "two-stage", "keyword")
DENSE_MODES = frozenset({"hybrid", "dense", "two-stage"})

# Ranker parameters, tuned on toollens/queries-train.jsonl only (see bench/eval_report.py).
FIELD_WEIGHTS: dict[str, int] = {
    "name": 1,
    "server": 1,
    "description": 1,
    "params": 1,
    "param_desc": 1,
    "summary": 1,
}
# Default fusion: z-scores of both branches over a pool of POOL_MULT * top_k candidates per
# branch, mixed with weight ALPHA on the dense side. On toollens train (16,893 queries):
# z/10x 0.375/0.370 R@5/nDCG@5, z/3x 0.371/0.367, minmax/3x 0.370/0.365, RRF/3x 0.359/0.344.
FUSIONS = ("z", "minmax", "rrf")
FUSION = "z"
ALPHA = 0.5  # dense weight in score fusion
POOL_MULT = 10  # candidates per branch for score fusion
FETCH_MULT = 3  # per-branch over-fetch for RRF (the baseline): 3 * top_k, k = 60
HNSW_MIN = 4096  # below this many candidate docs the dense branch is an exact numpy scan:
# faster there (2,000 docs: a scan 60 us, an hnswlib query for 50 plus mapping ~250 us) and exact
_EMBED_BATCH = 256


class ToolDoc(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as the engine ranks it; `name` (namespaced "server__tool") is the key."""

    name: str
    server: str
    tool: str
    description: str
    input_schema: dict[str, Any]
    server_summary: str = ""
    tags: tuple[str, ...] = ()


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


@dataclass(frozen=True, eq=False)
class _Entry:
    doc: ToolDoc
    text: str  # what the embedder sees
    key: bytes  # sha256 of `text`: the embedding cache key
    tokens: list[str]  # field-weighted BM25 tokens
    label: int = -1  # hnsw label, -1 if not in the dense index


def make_entry(doc: ToolDoc) -> _Entry:
    args = (doc.tool, doc.server, doc.description, doc.input_schema, doc.server_summary, doc.tags)
    text = dense_text(*args)
    fields = lexical_fields(*args)
    tokens: list[str] = []
    for fname, toks in fields.items():
        tokens.extend(toks * FIELD_WEIGHTS.get(fname, 1))
    return _Entry(doc=doc, text=text, key=hashlib.sha256(text.encode()).digest(), tokens=tokens)


@dataclass(frozen=True, eq=False)
class _Snapshot:
    version: int
    docs: tuple[ToolDoc, ...]
    servers: tuple[str, ...]
    server_pos: dict[str, np.ndarray]
    doc_server: np.ndarray  # index into `servers` per position
    bm25: Bm25Index
    vecs: np.ndarray | None  # (n, dim) normalised, None when bm25-only
    labels: np.ndarray | None  # hnsw label per position
    label_pos: dict[int, int]
    centroids: np.ndarray | None  # (len(servers), dim)
    scope_cache: dict[tuple[str, ...], tuple[np.ndarray, frozenset[int] | None]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.docs)

    def allowed(self, scope: tuple[str, ...] | None) -> np.ndarray | None:
        if scope is None:
            return None
        got = self.scope_cache.get(scope)
        if got is None:
            parts = [self.server_pos[s] for s in scope if s in self.server_pos]
            arr = np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
            got = (arr, None)
            if len(self.scope_cache) < 256:
                self.scope_cache[scope] = got
        return got[0]

    def allowed_labels(self, scope: tuple[str, ...], allowed: np.ndarray) -> frozenset[int]:
        got = self.scope_cache.get(scope)
        if got is not None and got[1] is not None:
            return got[1]
        assert self.labels is not None
        labels = frozenset(int(x) for x in self.labels[allowed])
        if len(self.scope_cache) < 256:
            self.scope_cache[scope] = (allowed, labels)
        return labels


def _build_snapshot(version: int, entries: dict[str, _Entry], vec_of: dict[bytes, np.ndarray] | None, dim: int) -> _Snapshot:
    ents = list(entries.values())
    docs = tuple(e.doc for e in ents)
    servers = tuple(sorted({d.server for d in docs}))
    sidx = {s: i for i, s in enumerate(servers)}
    doc_server = np.fromiter((sidx[d.server] for d in docs), dtype=np.int64, count=len(docs))
    order = np.argsort(doc_server, kind="stable")
    bounds = np.searchsorted(doc_server[order], np.arange(len(servers) + 1))
    server_pos = {s: order[bounds[i] : bounds[i + 1]] for i, s in enumerate(servers)}
    bm25 = Bm25Index([e.tokens for e in ents])
    vecs = labels = centroids = None
    label_pos: dict[int, int] = {}
    if vec_of is not None and ents and all(e.label >= 0 for e in ents):
        vecs = np.empty((len(ents), dim), dtype=np.float32)
        for i, e in enumerate(ents):
            vecs[i] = vec_of[e.key]
        labels = np.fromiter((e.label for e in ents), dtype=np.int64, count=len(ents))
        label_pos = {int(lab): i for i, lab in enumerate(labels)}
        sums = np.zeros((len(servers), dim), dtype=np.float32)
        np.add.at(sums, doc_server, vecs)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        centroids = sums / norms
    return _Snapshot(
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
    )


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
        self._embedder: Any = None
        self._embedder_error: str | None = None
        self._loaded = False
        self._load_lock = threading.Lock()
        self._update_lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._vec_of: dict[bytes, np.ndarray] = {}
        self._vec_dirty = False
        self._hnsw: Any = None  # HnswStore, created with the first vectors
        self._snap: _Snapshot | None = None
        self._cache: TtlLru[SearchOutcome] = TtlLru(cache_size, cache_ttl)
        self._qvecs: TtlLru[np.ndarray] = TtlLru(512, 0)
        self._counts = {
            "embeddings_computed": 0,
            "embeddings_cached": 0,
            "embedder_failures": 0,
            "degraded_searches": 0,
            "searches": 0,
            "updates": 0,
            "persist_failures": 0,
            "cache_corrupt": 0,
            "snapshot_restored": 0,
        }
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
    def embedder(self) -> Any:
        """The loaded Embedder, or None (bm25-only, or not loaded yet)."""
        return self._embedder

    def catalog_vectors(self) -> tuple[int, tuple[ToolDoc, ...], np.ndarray | None]:
        """(version, documents, their dense vectors or None) of the current snapshot, for
        analyses (Rift) that must not embed the catalog again. Read-only views."""
        snap = self._snap
        if snap is None:
            return 0, (), None
        return snap.version, snap.docs, snap.vecs

    # -- loading --------------------------------------------------------------------------

    def load(self) -> None:
        """Load the embedder (failure: logged, counted, bm25-only) and any persisted state."""
        with self._load_lock:
            if self._loaded:
                return
            t0 = time.perf_counter()
            if self.embedder_kind != "none":
                from toolatlas.retrieval.embed import get_embedder

                try:
                    self._embedder = get_embedder(self.embedder_kind, self.state_dir, self.query_threads)
                except Exception as exc:  # noqa: BLE001 - any failure degrades, never crashes
                    self._embedder = None
                    self._embedder_error = str(exc)
                    self._counts["embedder_failures"] += 1
                    log.error("retrieval.embedder_failed kind=%s error=%s; searching bm25-only", self.embedder_kind, exc)
            self._timings["embedder_load_s"] = time.perf_counter() - t0
            if self.state_dir is not None and self.persist:
                self._restore()
            self._timings["load_s"] = time.perf_counter() - t0
            # last: update() waits on _load_lock until the restored snapshot is in place
            self._loaded = True

    def _restore(self) -> None:
        assert self.state_dir is not None
        stale = persist.remove_stale_temps(self.state_dir)
        if stale:
            log.info("retrieval.stale_temps_removed %s (left by a writer that died mid-write)", ", ".join(sorted(stale)))
        emb = self._embedder
        if emb is not None:
            try:
                self._vec_of = persist.load_embeddings(self.state_dir, emb.name, emb.dim)
            except persist.CorruptFile as exc:
                self._counts["cache_corrupt"] += 1
                self._vec_dirty = True
                log.warning("retrieval.embedding_cache_corrupt %s; rebuilding it", exc)
        try:
            restored = persist.load_snapshot(self.state_dir, emb.name if emb else "none")
        except persist.CorruptFile as exc:
            self._counts["cache_corrupt"] += 1
            log.warning("retrieval.snapshot_corrupt %s; waiting for the catalog", exc)
            return
        if restored is None:
            return
        with self._update_lock:
            if self._snap is not None:  # a live catalog got here first: it wins
                return
            entries: dict[str, _Entry] = {}
            for doc, label in zip(restored.docs, restored.labels):
                entries[doc.name] = make_entry(doc)
            hnsw_ok = False
            if emb is not None and restored.hnsw_path is not None:
                if all(e.key in self._vec_of for e in entries.values()):
                    from toolatlas.retrieval.hnsw import HnswStore

                    try:
                        self._hnsw = HnswStore.load(
                            restored.hnsw_path, emb.dim, restored.next_label, live=len(entries)
                        )
                        for (name, e), label in zip(list(entries.items()), restored.labels):
                            entries[name] = dataclasses.replace(e, label=label)
                        hnsw_ok = True
                    except (RuntimeError, OSError, ValueError) as exc:
                        self._counts["cache_corrupt"] += 1
                        log.warning("retrieval.hnsw_load_failed %s; rebuilding the dense index", exc)
                        self._hnsw = None
            self._commit(entries, [], restored.version, persist_now=not hnsw_ok)
            if hnsw_ok:
                self._persisted_version = restored.version
            self._counts["snapshot_restored"] += 1
            log.info("retrieval.snapshot_restored tools=%d version=%d", len(entries), restored.version)

    # -- updates --------------------------------------------------------------------------

    def update(self, upserts: Sequence[ToolDoc], removes: Sequence[str]) -> int:
        """Apply a catalog change; returns the new catalog version. Blocking, serialised."""
        if not self._loaded:
            self.load()
        with self._update_lock:
            t0 = time.perf_counter()
            entries = dict(self._entries)
            stale: list[int] = []
            for name in removes:
                old = entries.pop(name, None)
                if old is not None and old.label >= 0:
                    stale.append(old.label)
            for doc in upserts:
                new = make_entry(doc)
                old = entries.get(doc.name)
                if old is not None and old.label >= 0:
                    if old.key == new.key:
                        new = dataclasses.replace(new, label=old.label)
                    else:
                        stale.append(old.label)
                entries[doc.name] = new
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
        if vectors.shape[0] != len(docs):
            raise ValueError(f"{len(docs)} docs but {vectors.shape[0]} vectors")
        with self._update_lock:
            for doc, vec in zip(docs, np.asarray(vectors, dtype=np.float32)):
                self._vec_of[make_entry(doc).key] = vec
            self._vec_dirty = True

    def _commit(self, entries: dict[str, _Entry], stale: list[int], version: int, persist_now: bool = True) -> None:
        """Embed what is missing, insert, then delete, then publish. Holds _update_lock."""
        emb = self._embedder
        if emb is not None:
            need = [name for name, e in entries.items() if e.label < 0]
            if need:
                try:
                    self._embed_missing([entries[n] for n in need])
                except Exception as exc:  # noqa: BLE001 - the embedder died: degrade
                    self._counts["embedder_failures"] += 1
                    self._embedder = None
                    self._embedder_error = str(exc)
                    emb = None
                    log.error("retrieval.embedder_failed during update: %s; searching bm25-only", exc)
            if emb is not None and need:
                from toolatlas.retrieval.hnsw import HnswStore

                if self._hnsw is None:
                    self._hnsw = HnswStore(emb.dim, capacity=max(1024, 2 * len(entries)))
                vecs = np.stack([self._vec_of[entries[n].key] for n in need])
                labels = self._hnsw.add(vecs)  # insert first ...
                for name, label in zip(need, labels):
                    entries[name] = dataclasses.replace(entries[name], label=int(label))
        if self._hnsw is not None and stale:
            self._hnsw.delete(stale)  # ... then delete
        snap = _build_snapshot(version, entries, self._vec_of if emb is not None else None, emb.dim if emb else 0)
        self._entries = entries
        self._snap = snap  # the atomic publish
        self._cache.clear()
        if persist_now and self.persist and self.state_dir is not None:
            self._persist(snap)

    def _embed_missing(self, ents: Sequence[_Entry]) -> None:
        missing: dict[bytes, str] = {}
        for e in ents:
            if e.key in self._vec_of:
                self._counts["embeddings_cached"] += 1
            elif e.key not in missing:
                missing[e.key] = e.text
        if not missing:
            return
        keys = list(missing)
        for s in range(0, len(keys), _EMBED_BATCH):
            chunk = keys[s : s + _EMBED_BATCH]
            vecs = self._embedder.embed([missing[k] for k in chunk])
            for k, v in zip(chunk, vecs):
                self._vec_of[k] = v
        self._counts["embeddings_computed"] += len(keys)
        self._vec_dirty = True

    def _persist(self, snap: _Snapshot) -> None:
        assert self.state_dir is not None
        emb = self._embedder
        try:
            if emb is not None and self._vec_dirty:
                live = {e.key for e in self._entries.values()}
                # keep everything live plus older vectors up to a bound, so flapping tools stay cheap
                keep = {k: v for k, v in self._vec_of.items() if k in live}
                for k, v in self._vec_of.items():
                    if len(keep) >= max(4 * len(live), 4096):
                        break
                    keep.setdefault(k, v)
                persist.save_embeddings(self.state_dir, emb.name, keep)
                self._vec_dirty = False
            persist.save_snapshot(
                self.state_dir,
                emb.name if emb is not None else "none",
                version=snap.version,
                docs=list(snap.docs),
                labels=[int(x) for x in snap.labels] if snap.labels is not None else [-1] * snap.n,
                hnsw=self._hnsw if snap.labels is not None else None,
            )
            self._persisted_version = snap.version
        except OSError as exc:
            self._counts["persist_failures"] += 1
            log.warning("retrieval.persist_failed dir=%s error=%s", self.state_dir, exc)

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
                qvec = self._query_vector(query, snap)
                if qvec is None and self.embedder_kind != "none":
                    degraded = "bm25-only"
                    self._counts["degraded_searches"] += 1
            positions, scores = self._rank(snap, query, qvec, top_k, scope, allowed, mode)
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

    def _query_vector(self, query: str, snap: _Snapshot) -> np.ndarray | None:
        emb = self._embedder
        if emb is None or snap.vecs is None:
            return None
        q = query.strip()
        key = (emb.query_name, q)
        vec = self._qvecs.get(key)
        if vec is None:
            try:
                vec = emb.embed_queries([q])[0]
            except Exception as exc:  # noqa: BLE001 - degrade this search, keep serving
                self._counts["embedder_failures"] += 1
                log.warning("retrieval.query_embed_failed error=%s; this search is bm25-only", exc)
                return None
            self._qvecs.put(key, vec)
        return vec

    def _rank(
        self,
        snap: _Snapshot,
        query: str,
        qvec: np.ndarray | None,
        k: int,
        scope: tuple[str, ...] | None,
        allowed: np.ndarray | None,
        mode: str,
    ) -> tuple[np.ndarray, np.ndarray]:
        tokens = tokenize(query)
        if mode == "keyword":
            return _keyword(snap, tokens, k, allowed)
        if mode == "bm25" or qvec is None:
            lex = snap.bm25.scores(tokens)
            top = fusion.top_indices(lex, k, allowed, positive=True)
            return top, lex[top]
        if mode == "dense":
            return self._dense(snap, qvec, k, scope, allowed)
        if mode == "two-stage":
            assert snap.centroids is not None
            if allowed is None:
                sids = np.arange(len(snap.servers))
                n_tools = snap.n
            else:
                sids = np.unique(snap.doc_server[allowed])
                n_tools = int(allowed.shape[0])
            s = fusion.two_stage_servers(k, int(sids.shape[0]), n_tools)
            sims = snap.centroids[sids] @ qvec
            chosen = sids[fusion.top_indices(sims, s)]
            sub = np.sort(np.concatenate([snap.server_pos[snap.servers[i]] for i in chosen]))
            if allowed is not None:
                sub = np.intersect1d(sub, allowed, assume_unique=True)
            return self._hybrid(snap, tokens, qvec, k, None, sub)
        return self._hybrid(snap, tokens, qvec, k, scope, allowed)

    def _hybrid(
        self,
        snap: _Snapshot,
        tokens: list[str],
        qvec: np.ndarray,
        k: int,
        scope: tuple[str, ...] | None,
        allowed: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        fetch = (FETCH_MULT if self.fusion == "rrf" else POOL_MULT) * k
        lex = snap.bm25.scores(tokens)
        lex_top = fusion.top_indices(lex, fetch, allowed, positive=True)
        dense_top, _ = self._dense(snap, qvec, fetch, scope, allowed)
        if self.fusion == "rrf":
            fused = fusion.rrf([lex_top.tolist(), dense_top.tolist()])
            items = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
            return np.array([p for p, _ in items], dtype=np.int64), np.array([s for _, s in items], dtype=np.float32)
        cand = np.union1d(lex_top, dense_top)
        assert snap.vecs is not None
        score = fusion.weighted(lex[cand], snap.vecs[cand] @ qvec, ALPHA, self.fusion)
        top = fusion.top_indices(score, k)
        return cand[top], score[top]

    def _dense(
        self,
        snap: _Snapshot,
        qvec: np.ndarray,
        k: int,
        scope: tuple[str, ...] | None,
        allowed: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        assert snap.vecs is not None and snap.labels is not None
        n_allowed = snap.n if allowed is None else int(allowed.shape[0])
        use_hnsw = (
            self._hnsw is not None
            and n_allowed >= HNSW_MIN
            and (allowed is None or n_allowed >= snap.n // 4)
        )
        if use_hnsw:
            filt = None
            if allowed is not None and scope is not None:
                labels_ok = snap.allowed_labels(scope, allowed)
                filt = labels_ok.__contains__
            elif allowed is not None:
                labels_ok = frozenset(int(x) for x in snap.labels[allowed])
                filt = labels_ok.__contains__
            labels = self._hnsw.query(qvec, k, ef=max(64, 2 * k), filter=filt)
            pos = np.fromiter(
                (p for p in (snap.label_pos.get(int(lab)) for lab in labels) if p is not None), dtype=np.int64
            )
            if pos.shape[0] >= min(k, n_allowed):
                sims = snap.vecs[pos] @ qvec
                order = np.lexsort((pos, -sims))
                return pos[order], sims[order]
        if allowed is None:
            sims = snap.vecs @ qvec
            top = fusion.top_indices(sims, k)
            return top, sims[top]
        sims = snap.vecs[allowed] @ qvec
        top = fusion.top_indices(sims, k)
        return allowed[top], sims[top]

    # -- status ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        snap = self._snap
        emb = self._embedder
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
            "dense_index": (
                {"live": self._hnsw.live, "deleted_slots": self._hnsw.deleted} if self._hnsw is not None else None
            ),
            "cache": {"hits": self._cache.hits, "misses": self._cache.misses, "size": len(self._cache)},
            **self._counts,
            "timings": {k: round(v, 4) for k, v in self._timings.items()},
        }


def _cache_key(
    query: str, top_k: int, servers: Collection[str] | str | None, snap: _Snapshot, mode: str
) -> tuple[str, int, tuple[str, ...] | None, int, str]:
    """The result-cache key of one search: (normalised query, top_k, scope, version, mode);
    the scope is None (every server) or the sorted server names."""
    if isinstance(servers, str):
        servers = [servers]
    scope = None if servers is None else tuple(sorted(set(servers)))
    return (normalise_query(query), top_k, scope, snap.version, mode)


def _keyword(snap: _Snapshot, tokens: list[str], k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Jaccard overlap between query and document token sets: the naive baseline."""
    inter, n_unique = snap.bm25.overlap(tokens)
    q = len(set(tokens))
    union = n_unique + q - inter
    score = np.where(union > 0, inter / np.maximum(union, 1), 0).astype(np.float32)
    top = fusion.top_indices(score, k, allowed, positive=True)
    return top, score[top]
