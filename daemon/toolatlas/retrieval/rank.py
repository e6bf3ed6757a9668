"""The rankers: pure functions of a snapshot, the query (its text and its vector) and k.

Each returns (positions into `snap.docs`, scores), best first, restricted to `allowed`
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
HNSW_MIN = 4096  # below this many candidate docs the dense branch is an exact numpy scan:
# faster there (2,000 docs: a scan 60 us, an hnswlib query for 50 plus mapping ~250 us) and exact

Ranked = tuple[np.ndarray, np.ndarray]  # (positions, scores), best first


def rank(
    snap: Snapshot,
    query: str,
    qvec: np.ndarray | None,
    k: int,
    scope: tuple[str, ...] | None,
    allowed: np.ndarray | None,
    mode: str,
    fusion_kind: str = FUSION,
    state: LearnedState | None = None,
    principal: str | None = None,
) -> Ranked:
    """Top `k` for `query` in `mode`; without a query vector every dense mode is bm25.

    `scope` is the sorted server names `allowed` was computed from (None: every server).
    "learned" is the hybrid ranker followed by the learned stage over `state` (usage
    events), as `principal` sees it; with no state, or an empty one, it is the hybrid."""
    tokens = tokenize(query)
    if mode == "learned":
        return learned(snap, tokens, qvec, k, scope, allowed, fusion_kind, state, principal)
    if mode == "keyword":
        return keyword(snap, tokens, k, allowed)
    if mode == "bm25" or qvec is None:
        return bm25(snap, tokens, k, allowed)
    if mode == "dense":
        return dense(snap, qvec, k, scope, allowed)
    if mode == "two-stage":
        return two_stage(snap, tokens, qvec, k, allowed, fusion_kind)
    return hybrid(snap, tokens, qvec, k, scope, allowed, fusion_kind)


def bm25(snap: Snapshot, tokens: list[str], k: int, allowed: np.ndarray | None) -> Ranked:
    """BM25 scores; documents matching no query token are left out."""
    lex = snap.bm25.scores(tokens)
    top = fusion.top_indices(lex, k, allowed, positive=True)
    return top, lex[top]


def keyword(snap: Snapshot, tokens: list[str], k: int, allowed: np.ndarray | None) -> Ranked:
    """Jaccard overlap between query and document token sets: the naive baseline."""
    inter, n_unique = snap.bm25.overlap(tokens)
    q = len(set(tokens))
    union = n_unique + q - inter
    score = np.where(union > 0, inter / np.maximum(union, 1), 0).astype(np.float32)
    top = fusion.top_indices(score, k, allowed, positive=True)
    return top, score[top]


def two_stage(
    snap: Snapshot, tokens: list[str], qvec: np.ndarray, k: int, allowed: np.ndarray | None, fusion_kind: str
) -> Ranked:
    """Stage one keeps the servers whose centroids are nearest the query (fusion.two_stage_servers
    of them); stage two is the hybrid ranker over their tools."""
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
    return hybrid(snap, tokens, qvec, k, None, sub, fusion_kind)


def hybrid(
    snap: Snapshot,
    tokens: list[str],
    qvec: np.ndarray,
    k: int,
    scope: tuple[str, ...] | None,
    allowed: np.ndarray | None,
    fusion_kind: str,
) -> Ranked:
    """Both branches fused: normalised scores ("z", "minmax") weighted by ALPHA over a
    k-independent candidate set (`fused_scores`), or reciprocal rank fusion ("rrf", the
    baseline: 3 x top_k per branch, k = 60)."""
    if fusion_kind == "rrf":
        fetch = FETCH_MULT * k
        lex = snap.bm25.scores(tokens)
        lex_top = fusion.top_indices(lex, fetch, allowed, positive=True)
        dense_top, _ = dense(snap, qvec, fetch, scope, allowed)
        fused = fusion.rrf([lex_top.tolist(), dense_top.tolist()])
        items = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        return np.array([p for p, _ in items], dtype=np.int64), np.array([s for _, s in items], dtype=np.float32)
    cand, score = fused_scores(snap, tokens, qvec, scope, allowed, fusion_kind)
    top = fusion.top_indices(score, k)
    return cand[top], score[top]


def learned(
    snap: Snapshot, tokens: list[str], qvec: np.ndarray | None, k: int, scope: tuple[str, ...] | None,
    allowed: np.ndarray | None, fusion_kind: str, state: LearnedState | None, principal: str | None,
) -> Ranked:
    """The zero-shot ranker's scores over every allowed document (bm25 z-scores without a
    query vector), re-ranked by the learned stage (learned.rerank)."""
    if state is None or state.empty:
        return bm25(snap, tokens, k, allowed) if qvec is None else hybrid(snap, tokens, qvec, k, scope, allowed, fusion_kind)
    if qvec is None:
        cand = np.arange(snap.n, dtype=np.int64) if allowed is None else allowed
        base = fusion.zscore(snap.bm25.scores(tokens)[cand])
    else:
        cand, base = fused_scores(snap, tokens, qvec, scope, allowed, FUSION if fusion_kind == "rrf" else fusion_kind)
    tool_pos = state.positions(snap.version, snap.pos_of)
    return learned_stage.rerank(state, tool_pos, base, cand, tokens, qvec, principal, k)


def evidence(
    snap: Snapshot, query: str, qvec: np.ndarray, scope: tuple[str, ...] | None, allowed: np.ndarray | None,
) -> tuple[float, float]:
    """(best cosine, best share of the query's BM25 ceiling) over the allowed documents:
    how close anything is, for abstention (adaptive.nothing_fits)."""
    tokens = tokenize(query)
    lex = snap.bm25.scores(tokens)
    lex = lex if allowed is None else lex[allowed]
    ceiling = snap.bm25.ceiling(tokens)
    best_cover = float(lex.max()) / ceiling if ceiling > 0 and lex.shape[0] else 0.0
    _, sims = dense(snap, qvec, 1, scope, allowed)
    return (float(sims[0]) if sims.shape[0] else -1.0), best_cover


def fused_scores(
    snap: Snapshot, tokens: list[str], qvec: np.ndarray, scope: tuple[str, ...] | None, allowed: np.ndarray | None,
    fusion_kind: str,
) -> Ranked:
    """(candidate positions, fused scores), not in rank order. The candidates are every
    allowed document up to HNSW_MIN of them, else the top FUSION_POOL of each branch: either
    way independent of top_k, so scores and order are too."""
    assert snap.vecs is not None
    lex = snap.bm25.scores(tokens)
    n_allowed = snap.n if allowed is None else int(allowed.shape[0])
    if n_allowed <= HNSW_MIN:
        cand = np.arange(snap.n, dtype=np.int64) if allowed is None else allowed
    else:
        lex_top = fusion.top_indices(lex, FUSION_POOL, allowed, positive=True)
        dense_top, _ = dense(snap, qvec, FUSION_POOL, scope, allowed)
        cand = np.union1d(lex_top, dense_top)
    return cand, fusion.weighted(lex[cand], snap.sims(qvec, cand), ALPHA, fusion_kind)


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
        labels = hnsw.query(qvec, k, ef=max(64, 2 * k), filter=filt)
        pos = np.fromiter(
            (p for p in (snap.label_pos.get(int(lab)) for lab in labels) if p is not None), dtype=np.int64
        )
        if pos.shape[0] >= min(k, n_allowed):
            sims = snap.sims(qvec, pos)
            order = np.lexsort((pos, -sims))
            return pos[order], sims[order]
    if allowed is None:
        sims = snap.sims(qvec)
        top = fusion.top_indices(sims, k)
        return top, sims[top]
    sims = snap.sims(qvec, allowed)
    top = fusion.top_indices(sims, k)
    return allowed[top], sims[top]
