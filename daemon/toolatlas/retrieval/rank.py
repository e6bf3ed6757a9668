"""The rankers: pure functions of one query's `QueryScores` (a snapshot, the query's tokens
and vector, the allowed positions) and k.

Each returns (positions into `snap.docs`, scores), best first, restricted to the allowed
positions (None: every document). No state of their own: the engine picks the mode, embeds
the query and caches results; everything here can be called on any published snapshot.
"""

from __future__ import annotations

import numpy as np

from toolatlas.retrieval import fusion
from toolatlas.retrieval import learned as learned_stage
from toolatlas.retrieval.learned import LearnedState
from toolatlas.retrieval.index import Snapshot
from toolatlas.retrieval.text import tokenize

MODES = ("hybrid", "bm25", "dense", "two-stage", "keyword", "learned")
DENSE_MODES = frozenset({"hybrid", "dense", "two-stage", "learned"})

# Default fusion ("z"): z-scores of both branches over every document the caller may search,
# mixed with weight ALPHA on the dense side. The normalisation never depends on top_k, so a
# tool's score and the order of the first k results are the same for every k. On toollens
# train (16,893 queries, R@5/nDCG@5): z over all 0.371/0.365 (alpha 0.4-0.7 within 0.004),
# the former z over a 10 x top_k pool 0.375/0.370 (k-dependent), RRF/3x 0.360/0.344, RRF over
# full lists 0.350/0.337; on mcptoolbenchpp z over all 0.977/0.903, RRF/3x 0.974/0.877.
FUSIONS = ("z", "minmax", "rrf")
FUSION = "z"
ALPHA = 0.5  # dense weight in score fusion
FUSION_POOL = 200  # above HNSW_MIN allowed documents: candidates per branch (fixed, not k-scaled)
FETCH_MULT = 3  # per-branch over-fetch for RRF (the baseline): 3 * top_k, k = 60
PROJECTED_MIN = 100  # fewest hnswlib candidates re-scored when it holds principal coordinates
HNSW_MIN = 4096  # below this many candidate docs the dense branch is an exact numpy scan:
# faster there (2,000 docs: a scan 60 us, an hnswlib query for 50 plus mapping ~250 us) and exact

Ranked = tuple[np.ndarray, np.ndarray]  # (positions, scores), best first


class QueryScores:
    """One query's per-document scores over one snapshot, each computed at most once: the
    ranker and the abstention evidence read the same arrays (a search computed BM25, the
    tokens and the cosine scan twice: 0.76 ms of ranking per query at 500 tools, 0.31 ms
    before the evidence existed)."""

    def __init__(self, snap: Snapshot, query: str | list[str], qvec: np.ndarray | None,
                 allowed: np.ndarray | None) -> None:
        """`query`: its text, or its tokens."""
        self.snap, self.qvec, self.allowed = snap, qvec, allowed
        self.tokens = tokenize(query) if isinstance(query, str) else query
        self._lex: np.ndarray | None = None
        self._sims: np.ndarray | None = None

    def within(self, allowed: np.ndarray) -> QueryScores:
        """The same query over other allowed documents: BM25 (over every document) kept."""
        out = QueryScores(self.snap, self.tokens, self.qvec, allowed)
        out._lex = self._lex
        return out

    @property
    def lex(self) -> np.ndarray:
        """BM25 score of every document (not only the allowed ones)."""
        if self._lex is None:
            self._lex = self.snap.bm25.scores(self.tokens)
        return self._lex

    @property
    def allowed_sims(self) -> np.ndarray:
        """Cosine of the query to every allowed document, in `allowed` order (an exact scan)."""
        if self._sims is None:
            assert self.qvec is not None
            self._sims = self.snap.sims(self.qvec, self.allowed)
        return self._sims


def rank(
    qs: QueryScores,
    k: int,
    scope: tuple[str, ...] | None,
    mode: str,
    fusion_kind: str = FUSION,
    state: LearnedState | None = None,
    principal: str | None = None,
) -> Ranked:
    """Top `k` for the query of `qs` in `mode`; without a query vector every dense mode is bm25.

    `scope` is the sorted server names `qs.allowed` was computed from (None: every server).
    "learned" is the hybrid ranker followed by the learned stage over `state` (usage
    events), as `principal` sees it; with no state, or an empty one, it is the hybrid. The
    caller keeps `qs` to read the same scores again (`evidence`)."""
    if mode == "learned":
        return learned(qs, k, scope, fusion_kind, state, principal)
    if mode == "keyword":
        return keyword(qs, k)
    if mode == "bm25" or qs.qvec is None:
        return bm25(qs, k)
    if mode == "dense":
        return dense(qs.snap, qs.qvec, k, scope, qs.allowed)
    if mode == "two-stage":
        return two_stage(qs, k, fusion_kind)
    return hybrid(qs, k, scope, fusion_kind)


def bm25(qs: QueryScores, k: int) -> Ranked:
    """BM25 scores; documents matching no query token are left out."""
    lex = qs.lex
    top = fusion.top_indices(lex, k, qs.allowed, positive=True)
    return top, lex[top]


def keyword(qs: QueryScores, k: int) -> Ranked:
    """Jaccard overlap between query and document token sets: the naive baseline."""
    inter, n_unique = qs.snap.bm25.overlap(qs.tokens)
    q = len(set(qs.tokens))
    union = n_unique + q - inter
    score = np.where(union > 0, inter / np.maximum(union, 1), 0).astype(np.float32)
    top = fusion.top_indices(score, k, qs.allowed, positive=True)
    return top, score[top]


def two_stage(qs: QueryScores, k: int, fusion_kind: str) -> Ranked:
    """Stage one keeps the servers whose centroids are nearest the query (fusion.two_stage_servers
    of them); stage two is the hybrid ranker over their tools."""
    snap, qvec, allowed = qs.snap, qs.qvec, qs.allowed
    assert snap.centroids is not None and qvec is not None
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
    return hybrid(qs.within(sub), k, None, fusion_kind)


def hybrid(qs: QueryScores, k: int, scope: tuple[str, ...] | None, fusion_kind: str) -> Ranked:
    """Both branches fused: normalised scores ("z", "minmax") weighted by ALPHA over a
    k-independent candidate set (`fused_scores`), or reciprocal rank fusion ("rrf", the
    baseline: 3 x top_k per branch, k = 60)."""
    snap, qvec, allowed = qs.snap, qs.qvec, qs.allowed
    assert qvec is not None
    if fusion_kind == "rrf":
        fetch = FETCH_MULT * k
        lex_top = fusion.top_indices(qs.lex, fetch, allowed, positive=True)
        dense_top, _ = dense(snap, qvec, fetch, scope, allowed)
        fused = fusion.rrf([lex_top.tolist(), dense_top.tolist()])
        items = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        return np.array([p for p, _ in items], dtype=np.int64), np.array([s for _, s in items], dtype=np.float32)
    cand, score = fused_scores(qs, scope, fusion_kind)
    top = fusion.top_indices(score, k)
    return cand[top], score[top]


def learned(
    qs: QueryScores, k: int, scope: tuple[str, ...] | None, fusion_kind: str, state: LearnedState | None,
    principal: str | None,
) -> Ranked:
    """The zero-shot ranker's scores over every allowed document (bm25 z-scores without a
    query vector), re-ranked by the learned stage (learned.rerank)."""
    snap, qvec, allowed = qs.snap, qs.qvec, qs.allowed
    if state is None or state.empty:
        return bm25(qs, k) if qvec is None else hybrid(qs, k, scope, fusion_kind)
    if qvec is None:
        cand = np.arange(snap.n, dtype=np.int64) if allowed is None else allowed
        base = fusion.zscore(qs.lex if allowed is None else qs.lex[allowed])
    else:
        cand, base = fused_scores(qs, scope, FUSION if fusion_kind == "rrf" else fusion_kind)
    tool_pos = state.positions(snap.version, snap.pos_of)
    return learned_stage.rerank(state, tool_pos, base, cand, qs.tokens, qvec, principal, k)


def evidence(qs: QueryScores, scope: tuple[str, ...] | None, ranker: str, state: LearnedState | None = None,
             principal: str | None = None) -> tuple[float, float] | None:
    """(best cosine, best share of the query's BM25 ceiling) over the allowed documents:
    how close anything is, for abstention (adaptive.nothing_fits); None without a query
    vector or for a `ranker` not calibrated for it (only "hybrid" and "learned" are). For
    "learned", a query whose very words led `principal` (or others who agree, see
    learned.repeats) to a tool it may use is as close as can be, (1.0, 1.0): however far it
    is from every description, that tool fits."""
    snap, qvec, allowed = qs.snap, qs.qvec, qs.allowed
    if qvec is None or ranker not in ("hybrid", "learned"):
        return None
    if ranker == "learned" and state is not None and not state.empty \
            and (led := learned_stage.repeats(state, qs.tokens, principal)):
        pos = state.positions(snap.version, snap.pos_of)[led]
        pos = pos[pos >= 0]
        if pos.shape[0] and (allowed is None or np.isin(pos, allowed).any()):
            return 1.0, 1.0
    lex = qs.lex if allowed is None else qs.lex[allowed]
    ceiling = snap.bm25.ceiling(qs.tokens)
    best_cover = float(lex.max()) / ceiling if ceiling > 0 and lex.shape[0] else 0.0
    n_allowed = snap.n if allowed is None else int(allowed.shape[0])
    if n_allowed <= HNSW_MIN:  # the scan the fusion made
        sims = qs.allowed_sims
        return (float(sims.max()) if sims.shape[0] else -1.0), best_cover
    _, top = dense(snap, qvec, 1, scope, allowed)
    return (float(top[0]) if top.shape[0] else -1.0), best_cover


def fused_scores(qs: QueryScores, scope: tuple[str, ...] | None, fusion_kind: str) -> Ranked:
    """(candidate positions, fused scores), not in rank order. The candidates are every
    allowed document up to HNSW_MIN of them, else the top FUSION_POOL of each branch: either
    way independent of top_k, so scores and order are too."""
    snap, qvec, allowed = qs.snap, qs.qvec, qs.allowed
    assert snap.vecs is not None and qvec is not None
    lex = qs.lex
    n_allowed = snap.n if allowed is None else int(allowed.shape[0])
    if n_allowed <= HNSW_MIN:
        if allowed is None:  # no fancy indexing: that copied the whole vector matrix per search
            return np.arange(snap.n, dtype=np.int64), fusion.weighted(lex, qs.allowed_sims, ALPHA, fusion_kind)
        return allowed, fusion.weighted(lex[allowed], qs.allowed_sims, ALPHA, fusion_kind)
    lex_top = fusion.top_indices(lex, FUSION_POOL, allowed, positive=True)
    dense_top, dense_sims = dense(snap, qvec, FUSION_POOL, scope, allowed)
    cand = np.union1d(lex_top, dense_top)
    sims = snap.sims(qvec, cand)
    if snap.vecs.dtype != np.float32:  # the dense candidates keep the exact scores `dense` gave them
        sims[np.searchsorted(cand, dense_top)] = dense_sims
    return cand, fusion.weighted(lex[cand], sims, ALPHA, fusion_kind)


def dense(
    snap: Snapshot, qvec: np.ndarray, k: int, scope: tuple[str, ...] | None, allowed: np.ndarray | None
) -> Ranked:
    """Cosine similarity: hnswlib candidates re-scored exactly for large candidate sets, an
    exact numpy scan below HNSW_MIN (or when hnswlib returns too few)."""
    assert snap.vecs is not None and snap.labels is not None
    n_allowed = snap.n if allowed is None else int(allowed.shape[0])
    hnsw = snap.hnsw
    use_hnsw = hnsw is not None and n_allowed >= HNSW_MIN and (allowed is None or n_allowed >= snap.n // 4)
    if use_hnsw:
        assert hnsw is not None
        filt = None
        if allowed is not None and scope is not None:
            labels_ok = snap.allowed_labels(scope, allowed)
            filt = labels_ok.__contains__
        elif allowed is not None:
            labels_ok = frozenset(int(x) for x in snap.labels[allowed])
            filt = labels_ok.__contains__
        # principal coordinates: more candidates, scored exactly (at least PROJECTED_MIN: a top 1
        # or 10 from 2k of them missed some of the exact ones; ToolLens's dense mode, forced)
        want = k if hnsw.basis is None else max(2 * k, PROJECTED_MIN)
        labels, dists = hnsw.search(qvec, want, ef=max(64, 2 * want), filter=filt)
        mapped = np.full(labels.shape[0], -1, dtype=np.int64)
        ours = labels < snap.label_pos.shape[0]
        mapped[ours] = snap.label_pos[labels[ours]]
        known = mapped >= 0  # labels this snapshot has (a newer one's are skipped)
        pos = mapped[known]
        if pos.shape[0] >= min(k, n_allowed):
            if snap.vecs.dtype == np.float32 or hnsw.basis is not None:
                sims = snap.sims(qvec, pos)
            else:  # int16 rows and hnswlib holds whole float32 vectors: its cosine is the exact score
                sims = 1.0 - dists[known]
            order = np.lexsort((pos, -sims))[:k]
            return pos[order], sims[order]
    if allowed is None:
        sims = snap.sims(qvec)
        top = fusion.top_indices(sims, k)
        return top, sims[top]
    sims = snap.sims(qvec, allowed)
    top = fusion.top_indices(sims, k)
    return allowed[top], sims[top]
