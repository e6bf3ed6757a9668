"""Layer 1: average-linkage agglomerative clustering of unit vectors by cosine distance.

Two clusters merge while the mean similarity between their members is at least `theta`
(cosine distance threshold 1 - theta). Such a merge needs at least one pair at or above
`theta`, so final clusters never cross the connected components of the graph "sim >= theta":
we cluster each component on its own, which keeps large sparse catalogs cheap.
"""

from __future__ import annotations

import numpy as np


def _components(sims: np.ndarray, theta: float) -> list[np.ndarray]:
    n = sims.shape[0]
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    ii, jj = np.nonzero(np.triu(sims >= theta, k=1))
    for i, j in zip(ii.tolist(), jj.tolist()):
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[ri] = rj
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return [np.array(g) for g in groups.values() if len(g) > 1]


def _average_linkage(s: np.ndarray, theta: float) -> list[list[int]]:
    """Clusters (local indices) of one component; `s` is its similarity matrix."""
    m = s.shape[0]
    work = s.astype(np.float64, copy=True)
    np.fill_diagonal(work, -np.inf)
    sizes = np.ones(m)
    members: list[list[int] | None] = [[i] for i in range(m)]
    while True:
        flat = int(np.argmax(work))
        i, j = divmod(flat, m)
        if not np.isfinite(work[i, j]) or work[i, j] < theta:
            break
        # Lance-Williams update for average linkage: merge j into i.
        merged = (sizes[i] * work[i] + sizes[j] * work[j]) / (sizes[i] + sizes[j])
        work[i, :] = merged
        work[:, i] = merged
        work[i, i] = -np.inf
        work[j, :] = -np.inf
        work[:, j] = -np.inf
        sizes[i] += sizes[j]
        mi, mj = members[i], members[j]
        assert mi is not None and mj is not None
        mi.extend(mj)
        members[j] = None
    return [sorted(g) for g in members if g is not None and len(g) > 1]


def agglomerate(vecs: np.ndarray, theta: float) -> list[list[int]]:
    """Clusters of two or more row indices of `vecs` (L2-normalised), largest first."""
    if vecs.shape[0] < 2:
        return []
    sims = vecs @ vecs.T
    out: list[list[int]] = []
    for comp in _components(sims, theta):
        sub = sims[np.ix_(comp, comp)]
        for group in _average_linkage(sub, theta):
            out.append(sorted(int(comp[g]) for g in group))
    out.sort(key=lambda g: (-len(g), g[0]))
    return out


def cohesion(vecs: np.ndarray, members: list[int]) -> float:
    """Mean pairwise cosine similarity of a cluster's members."""
    v = vecs[members]
    s = v @ v.T
    n = len(members)
    return float((s.sum() - np.trace(s)) / (n * (n - 1)))
