"""Layer 1: average-linkage agglomerative clustering of unit vectors by cosine distance.

Two clusters merge while the mean similarity between their members is at least `theta`
(cosine distance threshold 1 - theta). Such a merge needs at least one pair at or above
`theta`, so final clusters never cross the connected components of the graph "sim >= theta":
we cluster each component on its own, which keeps large sparse catalogs cheap.
"""

from __future__ import annotations

import numpy as np


def _components(sims: np.ndarray, theta: float) -> list[np.ndarray]:
    """Connected components (two or more members) of the graph "sim >= theta", by breadth-first
    search a frontier at a time: each row of the matrix is read once, in numpy, however many
    edges there are (a server of thousands of near-identical tools has millions)."""
    n = sims.shape[0]
    label = np.full(n, -1)
    out: list[np.ndarray] = []
    for start in range(n):
        if label[start] >= 0:
            continue
        label[start] = start
        members = [np.array([start])]
        frontier = members[0]
        while frontier.size:
            near = (sims[frontier] >= theta).any(axis=0) & (label < 0)
            frontier = np.flatnonzero(near)
            label[frontier] = start
            members.append(frontier)
        comp = np.sort(np.concatenate(members))
        if comp.size > 1:
            out.append(comp)
    return out


def _average_linkage(s: np.ndarray, theta: float) -> list[list[int]]:
    """Clusters (local indices) of one component; `s` is its similarity matrix.

    The nearest-neighbour chain algorithm: follow nearest neighbours until two are each
    other's nearest, merge them (Lance-Williams update for average linkage), go on from the
    rest of the chain. Average linkage is reducible, so this gives the same clusters as
    always merging the globally closest pair, in O(m^2) rather than O(m^3) (one row scanned
    a step, at most 4m steps, where the global search scanned the whole matrix each merge).
    A cluster whose nearest neighbour is below `theta` is final: an average of similarities
    below theta stays below it, so nothing it could join later reaches theta."""
    m = s.shape[0]
    work = s.astype(np.float64, copy=True)
    np.fill_diagonal(work, -np.inf)
    sizes = np.ones(m)
    members: list[list[int] | None] = [[i] for i in range(m)]
    open_ = list(range(m - 1, -1, -1))  # clusters not yet final, popped from the end
    alive = np.ones(m, dtype=bool)
    chain: list[int] = []
    for _ in range(5 * m + 5):  # a step pushes (<= 2m: clusters ever made), merges or finalises (<= m each)
        if not chain:
            while open_ and not alive[open_[-1]]:
                open_.pop()
            if not open_:
                break
            chain.append(open_[-1])
        a = chain[-1]
        row = work[a]
        b = int(np.argmax(row))
        if len(chain) > 1 and row[chain[-2]] >= row[b]:
            b = chain[-2]  # ties go to the previous link, so the chain cannot cycle
        if not row[b] >= theta:  # -inf (alone) or below theta: `a` is final
            alive[a] = False
            work[a, :] = -np.inf
            work[:, a] = -np.inf
            chain.pop()
            continue
        if len(chain) < 2 or b != chain[-2]:
            chain.append(b)
            continue
        chain.pop()
        chain.pop()
        i, j = min(a, b), max(a, b)
        merged = (sizes[i] * work[i] + sizes[j] * work[j]) / (sizes[i] + sizes[j])
        work[i, :] = merged
        work[:, i] = merged
        work[i, i] = -np.inf
        work[j, :] = -np.inf
        work[:, j] = -np.inf
        alive[j] = False
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
