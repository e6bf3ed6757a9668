"""Rank fusion and the small pure functions around it (top-k, normalisation, two-stage s).

Everything here is pure numpy on small arrays so it can be unit-tested exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RRF_K = 60


def top_indices(scores: np.ndarray, k: int, allowed: np.ndarray | None = None, *, positive: bool = False) -> np.ndarray:
    """Positions of the `k` highest scores (restricted to `allowed` positions), best first.

    Ties break towards the lower position so results are deterministic. With `positive`,
    only strictly positive scores qualify.
    """
    if allowed is not None:
        pos = allowed
        vals = scores[allowed]
    else:
        pos = np.arange(scores.shape[0])
        vals = scores
    if positive:
        keep = vals > 0
        pos, vals = pos[keep], vals[keep]
    if k <= 0 or vals.shape[0] == 0:
        return np.empty(0, dtype=np.int64)
    if vals.shape[0] > k:
        part = np.argpartition(-vals, k - 1)[:k]
        # include everything tied with the k-th score so tie-breaking is by position
        kth = vals[part].min()
        part = np.flatnonzero(vals >= kth)
        pos, vals = pos[part], vals[part]
    order = np.lexsort((pos, -vals))[:k]
    return pos[order].astype(np.int64)


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> dict[int, float]:
    """Reciprocal rank fusion: sum over lists of 1 / (k + rank), rank starting at 1."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank)
    return fused


def minmax(values: np.ndarray) -> np.ndarray:
    """Scale to [0, 1]; a constant vector maps to all ones (every candidate equally good)."""
    if values.shape[0] == 0:
        return values.astype(np.float32)
    lo, hi = float(values.min()), float(values.max())
    if hi - lo <= 1e-12:
        return np.ones_like(values, dtype=np.float32)
    return ((values - lo) / (hi - lo)).astype(np.float32)


def zscore(values: np.ndarray) -> np.ndarray:
    """Standardise to mean 0, deviation 1; a constant vector maps to all zeros."""
    if values.shape[0] == 0:
        return values.astype(np.float32)
    sd = float(values.std())
    if sd <= 1e-12:
        return np.zeros_like(values, dtype=np.float32)
    scaled: np.ndarray = ((values - values.mean()) / sd).astype(np.float32)
    return scaled


def weighted(lexical: np.ndarray, dense: np.ndarray, alpha: float, norm: str = "z") -> np.ndarray:
    """Convex combination of normalised branch scores over one candidate pool.

    `alpha` weighs the dense branch; both arrays score the same candidates in the same order;
    `norm` is "z" (z-score) or "minmax".
    """
    f = zscore if norm == "z" else minmax
    return (alpha * f(dense) + (1.0 - alpha) * f(lexical)).astype(np.float32)


def two_stage_servers(k: int, n_servers: int, n_tools: int) -> int:
    """How many servers stage one keeps: s = min(m, max(2, floor(2k / n_bar) + 1))."""
    if n_servers <= 0:
        return 0
    n_bar = n_tools / n_servers
    return min(n_servers, max(2, math.floor(2 * k / n_bar) + 1))


def guard(learned: list[int], zero: list[int], fed: np.ndarray, strong: np.ndarray | None = None) -> list[int]:
    """`learned` reordered so each item without feedback (`fed` false: none, or too little
    to judge it by, see learned.LearnedState.weak) in `zero` (the zero-shot top, best first)
    keeps a rank no lower than its zero-shot one, counted after the `strong` items (feedback
    from a repeat of this very query), which go first in their learned order. The others keep
    their learned order. Pure."""
    out = [i for i in learned if strong is not None and strong[i]]
    lead = len(out)
    deadline = {r + lead: i for r, i in enumerate(zero) if not fed[i]}
    if not deadline:
        return learned if not lead else out + [i for i in learned if i not in out]
    placed = set(out)
    pending = iter(learned)
    while True:
        due = deadline.get(len(out))
        nxt = due if due is not None and due not in placed else next((i for i in pending if i not in placed), None)
        if nxt is None:  # the learned order ran out: the pinned left, in zero-shot order
            nxt = next((i for i in zero if i not in placed and i in deadline.values()), None)
            if nxt is None:
                return out
        out.append(nxt)
        placed.add(nxt)
