"""Compact parts of the learned state (learned.py), arrays rather than a Python object per
past query: who asked what (`Asked`), the tools used after each past query (`RowTools`),
and the growth of the past query vectors' 8-bit rows.

At ToolLens train's 16,893 past queries (44,865 events) the dicts and tuples these replace
held 11 MB; the arrays hold 1.2 MB (bench/learning.py --only cost).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

INSERT_BELOW = 8  # merge by insertion while the new items are under 1/8 of those held


@dataclass(frozen=True, eq=False)
class Asked:
    """Which principals asked a query with given words (its `words_key`) and then used a
    tool: the distinct (words_key, tool, principal) triples, sorted, as three arrays (as a
    dict of dicts of tuples they took 7.5 MB at ToolLens train's 16,893 queries; so, 0.7 MB)."""

    key: np.ndarray  # (n,) int64, ascending
    tool: np.ndarray  # (n,) int32
    principal: np.ndarray  # (n,) int32

    @classmethod
    def empty(cls) -> Asked:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32))

    def of(self, key: int) -> dict[int, list[int]]:
        """tool -> the principals who used it after a query with words `key`."""
        lo, hi = int(np.searchsorted(self.key, key, "left")), int(np.searchsorted(self.key, key, "right"))
        out: dict[int, list[int]] = {}
        for t, p in zip(self.tool[lo:hi].tolist(), self.principal[lo:hi].tolist()):
            out.setdefault(t, []).append(p)
        return out

    def merged(self, triples: np.ndarray) -> Asked:
        """A new Asked with the (m, 3) int64 `triples` (words_key, tool, principal) added:
        a few into many are inserted (a publish every half second must not re-sort them
        all), else everything is sorted again."""
        if triples.shape[0] * INSERT_BELOW < self.key.shape[0]:
            return self._inserted(triples)
        key = np.concatenate([self.key, triples[:, 0]])
        tool = np.concatenate([self.tool, triples[:, 1].astype(np.int32)])
        principal = np.concatenate([self.principal, triples[:, 2].astype(np.int32)])
        order = np.lexsort((principal, tool, key))
        key, tool, principal = key[order], tool[order], principal[order]
        first = np.ones(key.shape[0], dtype=bool)
        first[1:] = (key[1:] != key[:-1]) | (tool[1:] != tool[:-1]) | (principal[1:] != principal[:-1])
        return Asked(key[first], tool[first], principal[first])

    def _inserted(self, triples: np.ndarray) -> Asked:
        """`merged` for a few triples: each new one goes where the full sort would put it."""
        at: list[int] = []
        adds: list[tuple[int, int, int]] = []
        for k, t, p in sorted(set(map(tuple, triples.tolist()))):
            lo, hi = int(np.searchsorted(self.key, k, "left")), int(np.searchsorted(self.key, k, "right"))
            held = list(zip(self.tool[lo:hi].tolist(), self.principal[lo:hi].tolist()))
            if (t, p) in held:
                continue
            at.append(lo + sum(1 for pair in held if pair < (t, p)))
            adds.append((k, t, p))
        if not adds:
            return self
        new = np.array(adds, dtype=np.int64)
        return Asked(np.insert(self.key, at, new[:, 0]), np.insert(self.tool, at, new[:, 1].astype(np.int32)),
                     np.insert(self.principal, at, new[:, 2].astype(np.int32)))


@dataclass(frozen=True, eq=False)
class RowTools:
    """The tools used after each vector row (a principal's distinct query), with their event
    counts: row r's are `tool[start[r]:start[r + 1]]` (a dict per row took 3.7 MB at
    ToolLens train's 16,893 rows; so, 0.5 MB)."""

    start: np.ndarray  # (rows + 1,) int64
    tool: np.ndarray  # int32, ascending within a row
    count: np.ndarray  # int32

    @classmethod
    def empty(cls) -> RowTools:
        return cls(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32))

    def of(self, r: int) -> Iterable[tuple[int, int]]:
        """(tool, events) of row `r`."""
        lo, hi = self.start[r], self.start[r + 1]
        return zip(self.tool[lo:hi].tolist(), self.count[lo:hi].tolist())

    def _gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(each of `rows`' number of tools, where each row's part of the gather ends, where
        their entries are in `tool`/`count`)."""
        lo = self.start[rows]
        lens = self.start[rows + 1] - lo
        ends = np.cumsum(lens)
        at = np.arange(int(ends[-1]) if ends.shape[0] else 0) + np.repeat(lo - (ends - lens), lens)
        return lens, ends, at

    def of_rows(self, rows: np.ndarray) -> tuple[list[int], list[int], list[int]]:
        """The tools and event counts of `rows` in one gather: (where each row's part of
        the lists ends, tools, counts)."""
        _, ends, at = self._gather(rows)
        return ends.tolist(), self.tool[at].tolist(), self.count[at].tolist()

    def backers(self, rows: np.ndarray, principal: np.ndarray, tools: int) -> np.ndarray:
        """Per tool (`tools` of them): how many distinct principals have one of `rows` (whose
        principals are `principal`) leading to it."""
        lens, _, at = self._gather(rows)
        pairs = np.unique(np.repeat(principal.astype(np.int64), lens) * tools + self.tool[at])
        return np.bincount(pairs % tools, minlength=tools)

    def merged(self, uses: np.ndarray, rows: int) -> RowTools:
        """A new RowTools of `rows` rows with the (m, 2) int64 (row, tool) `uses` counted in
        (a few into many by insertion, as `Asked.merged`)."""
        if uses.shape[0] * INSERT_BELOW < self.tool.shape[0]:
            return self._inserted(uses, rows)
        row = np.concatenate([np.repeat(np.arange(self.start.shape[0] - 1), np.diff(self.start)), uses[:, 0]])
        tool = np.concatenate([self.tool, uses[:, 1].astype(np.int32)])
        count = np.concatenate([self.count, np.ones(uses.shape[0], dtype=np.int32)])
        order = np.lexsort((tool, row))
        row, tool, count = row[order], tool[order], count[order]
        first = np.ones(row.shape[0], dtype=bool)
        first[1:] = (row[1:] != row[:-1]) | (tool[1:] != tool[:-1])
        at = np.flatnonzero(first)
        count = np.add.reduceat(count, at).astype(np.int32) if at.shape[0] else count
        row, tool = row[first], tool[first]
        return RowTools(np.searchsorted(row, np.arange(rows + 1)).astype(np.int64), tool, count)

    def _inserted(self, uses: np.ndarray, rows: int) -> RowTools:
        """`merged` for a few uses: counts of held (row, tool) pairs go up in a copy, new
        pairs are inserted in their row, tools ascending."""
        held_rows = self.start.shape[0] - 1
        count = self.count.copy()
        lens = np.zeros(rows, dtype=np.int64)
        lens[:held_rows] = np.diff(self.start)
        at: list[int] = []
        adds: list[tuple[int, int]] = []  # (tool, events), in the order of `at`
        tally: dict[tuple[int, int], int] = {}
        for r, t in uses.tolist():
            tally[(r, t)] = tally.get((r, t), 0) + 1
        for (r, t), n in sorted(tally.items()):
            lo = int(self.start[min(r, held_rows)])
            hi = int(self.start[r + 1]) if r < held_rows else lo
            j = lo + int(np.searchsorted(self.tool[lo:hi], t))
            if j < hi and self.tool[j] == t:
                count[j] += n
                continue
            at.append(j)
            adds.append((t, n))
            lens[r] += 1
        start = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(lens, out=start[1:])
        if not adds:
            return RowTools(start, self.tool, count)
        new = np.array(adds, dtype=np.int32)
        return RowTools(start, np.insert(self.tool, at, new[:, 0]), np.insert(count, at, new[:, 1]))


def grown(arr: np.ndarray, used: int, add: int, row_shape: tuple[int, ...]) -> np.ndarray:
    """`arr` (its first `used` rows kept) with room for `add` more rows of `row_shape`: itself
    when it has room, else a new array of at least twice the rows (published states keep the
    old one)."""
    if used + add <= arr.shape[0] and arr.shape[1:] == row_shape:
        return arr
    out = np.zeros((max(1024, 2 * arr.shape[0], used + add), *row_shape), dtype=arr.dtype)
    if used:
        out[:used] = arr[:used]
    return out


def words_key(tokens: Iterable[str]) -> int:
    """What identifies a query's words (any order, repeats ignored) in `Asked` (and
    `LearnedState.asked`): a 64-bit hash, not the words (a set of them per past query held
    50 MB at 17k queries)."""
    return hash(frozenset(tokens))


__all__ = ["INSERT_BELOW", "Asked", "RowTools", "grown", "words_key"]
