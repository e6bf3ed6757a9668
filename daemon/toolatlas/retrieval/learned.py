"""The learned stage: what past executions say about a query, fused with the zero-shot ranker.

A `LearnedState` is built from usage events (usage.py) and is immutable once published, like
a `Snapshot`. It holds two signals for a query:

- a kNN vote: the `KNN` past queries nearest the query's vector (one row per distinct query
  of a principal; an exact scan below `HNSW_MIN_EVENTS` rows; above, hnswlib finds
  candidates in a `PROJ_DIMS`-coordinate principal-component basis and the best `RESCORE`
  are scored on 8-bit copies of the whole vectors) vote for the tools executed after them,
  each with weight similarity x decay;
- a lexical match against the tool's past queries (BM25 over one document per tool made of
  the queries that led to it).

Bounded influence per principal: the caller's own events count in full (a single-user daemon
learns from every repetition). Other principals' events count once per (principal, tool) in
the vote (that principal's best neighbour) and at most `OTHER_WORD_CAP` times per
(principal, tool, word) in the lexical document, and only where at least `MIN_PRINCIPALS`
other principals agree (for the vote: used the tool after one of the `AGREE_K` past queries
nearest this one): what one other user did, however often, never changes anyone else's
ranking (nor leaks their words into it).

`rerank` fuses the zero-shot scores with both signals and then applies the guard
(fusion.guard): a tool with no feedback at all keeps at least its zero-shot rank within the
top `GUARD_DEPTH`, so feedback on other tools never buries an unused one. Nor a barely used
one: a tool with fewer events than `WEAK_SHARE` of the mean of the tools with feedback is
kept there too (`LearnedState.weak`), since the past queries that did not lead to it say
little when so few did; without this, one use made a tool harder to find than none
(bench/README.md, "Stop 58"). Events of tools not in the snapshot (removed, quarantined) and
of tools the caller may not use are ignored: the stage only ever reorders
the allowed positions.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from toolatlas.retrieval import fusion
from toolatlas.retrieval.bm25 import Bm25Index
from toolatlas.retrieval.hnsw import HnswStore, principal_basis
from toolatlas.retrieval.pastqueries import Asked, RowTools, grown, words_key
from toolatlas.retrieval.pastwords import PastWords
from toolatlas.retrieval.text import tokenize
from toolatlas.retrieval.usage import UsageEvent

KNN = 20  # past queries that vote
HNSW_MIN_EVENTS = 2048  # below this an exact scan is as fast and exact
HNSW_EF_CONSTRUCTION = 64
# Above HNSW_MIN_EVENTS a past query's 384 float32 coordinates (1.5 KB) are held as 8 bits
# each plus a scale, and hnswlib gets only its first PROJ_DIMS principal components (of the
# rows held when hnswlib is built: at HNSW_MIN_EVENTS, and all of them at each reload, i.e.
# at start and at each hourly prune); the RESCORE candidates hnswlib finds there are scored
# on the 8-bit rows (cosines within 0.002).
# ToolLens train (16,893 rows), its test queries: recall of the exact 20 nearest 0.9895,
# as with hnswlib over the whole float32 vectors (bench/README.md, "Stop 41").
PROJ_DIMS = 128
RESCORE = 160
KNN_WEIGHT = 40.0  # weight of the vote share (0..1) against z-scored zero-shot scores
LEX_WEIGHT = 20.0  # weight of the past-query lexical coverage (0..1)
SIM_FLOOR = 0.3  # a past query less similar than this does not vote
HALF_LIFE_DAYS = 30.0  # an event's weight halves every this many days
GUARD_DEPTH = 5  # tools without feedback keep their zero-shot rank within this depth
MIN_PRINCIPALS = 2  # other principals who must agree before their evidence counts
OTHER_WORD_CAP = 3  # another principal's events using a word count at most this often in a tool's document
AGREE_K = 80  # other principals agree on a tool among this many nearest past queries (the vote's KNN within)
STRONG_SIM = 0.9  # a past query this similar (or with the same words) is a repeat: see fusion.guard
WEAK_SHARE = 0.05  # a tool with fewer events than this share of the mean per tool with feedback is guarded as unused

_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True, eq=False)
class LearnedState:
    """Usage events as the learned stage reads them (see the module docstring)."""

    version: int
    tools: tuple[str, ...]  # tools with feedback (names); the arrays index into this
    vecs: np.ndarray  # (m, dim) past query vectors for the exact scan; (0, dim) when in `hnsw`
    row_tools: RowTools  # per row (a principal's distinct query): tool -> events
    ev_principal: np.ndarray  # (m,) index into principals
    weight: np.ndarray  # (m,) decay weight
    principals: dict[str, int]
    words: tuple[dict[int, dict[str, int]], ...]  # per tool: principal -> word -> events using it
    asked: Asked  # which principals asked a query with these words, then used a tool
    events: int
    tool_at: tuple[float, ...] = ()  # per tool: its latest event's time (catalog_status: updated_at)
    tool_events: tuple[int, ...] = ()  # per tool: its events (all principals')
    hnsw: HnswStore | None = None  # the rows' principal coordinates, labels = rows (shared; see neighbours)
    q8: np.ndarray | None = None  # (>= rows, dim) int8 rows when in `hnsw` (a row = q8 x scale)
    scale: np.ndarray | None = None  # (>= rows,) float32
    rows: int = 0  # vector rows of this state
    dim: int = 0  # their dimension
    _pos_cache: dict[int, np.ndarray] = field(default_factory=dict)
    _lex_cache: dict[int, Bm25Index] = field(default_factory=dict)
    _past: list[PastWords] = field(default_factory=list)  # memo (at most one) until every index is built
    _weak: list[np.ndarray] = field(default_factory=list)  # memo of `weak`

    def lexical(self, own: int) -> Bm25Index:
        """BM25 over one document per tool: the words of principal `own`'s past queries
        (as often as its events used them) plus those of other principals where at least
        MIN_PRINCIPALS of them used the word for that tool (as often as each one's events
        used it, up to OTHER_WORD_CAP). Memoised (pastwords.py: the sums over all
        principals once per state, then `own`'s words only)."""
        got = self._lex_cache.get(own)
        if got is None:
            past = next(iter(self._past), None)  # one step: searches run in several threads
            if past is None:
                past = PastWords(self.words, cap=OTHER_WORD_CAP, min_principals=MIN_PRINCIPALS)
                self._past[:] = [past]
            got = past.index(own)
            if len(self._lex_cache) > 64:
                self._lex_cache.clear()
            self._lex_cache[own] = got
            if len(self._lex_cache) > len(self.principals):  # every index this state can need
                self._past.clear()
        return got

    @property
    def empty(self) -> bool:
        return not self.tools

    def weak(self) -> np.ndarray:
        """Per tool of `tools`: too few events to judge it by the past queries that did not
        lead to it (fewer than WEAK_SHARE of the mean per tool). Memoised."""
        got = next(iter(self._weak), None)
        if got is None:
            events = np.asarray(self.tool_events, dtype=np.float64)
            if events.shape[0] == len(self.tools) and events.shape[0]:
                got = events < WEAK_SHARE * events.mean()
            else:  # no counts (a state not built by LearningIndex): none is weak
                got = np.zeros(len(self.tools), dtype=bool)
            self._weak[:] = [got]
        return got

    def positions(self, snap_version: int, pos_of: dict[str, int]) -> np.ndarray:
        """Snapshot position of each of `tools` (-1: not in that catalog), memoised per version."""
        got = self._pos_cache.get(snap_version)
        if got is None:
            got = np.fromiter((pos_of.get(t, -1) for t in self.tools), dtype=np.int64, count=len(self.tools))
            if len(self._pos_cache) > 8:
                self._pos_cache.clear()
            self._pos_cache[snap_version] = got
        return got


def empty_state(version: int = 0) -> LearnedState:
    return LearnedState(
        version=version, tools=(), vecs=np.zeros((0, 0), dtype=np.float32), row_tools=RowTools.empty(),
        ev_principal=np.zeros(0, dtype=np.int64), weight=np.zeros(0, dtype=np.float32), principals={},
        words=(), asked=Asked.empty(), events=0,
    )


class LearningIndex:
    """The events behind the learned stage, kept so that a new event costs its own tokens and
    vector, not a rebuild; `state()` publishes an immutable `LearnedState`. One owner thread
    (the daemon's learning worker, or an evaluation): not thread-safe itself; the hnswlib
    store it shares with published states has its own lock (hnsw.HnswStore).

    Memory (issue 17's cost row): the events themselves are not kept (counts only); a past
    query's vector is a float32 row of the exact-scan array below `HNSW_MIN_EVENTS` rows, and
    above, an int8 row plus PROJ_DIMS float32 coordinates in hnswlib; who asked what and each
    row's tools are arrays (pastqueries.py) merged with what `add` collected at each
    `state()`; and a state shares the per-tool word dicts with the index, copy on write: `add`
    copies a dict a published state holds before changing it (once per publish), so
    publishing costs pointers, not a second copy of everything."""

    def __init__(self, half_life_days: float = HALF_LIFE_DAYS) -> None:
        self.half_life_days = half_life_days
        self._reset()

    def _reset(self) -> None:
        self.n_events = 0
        self.missing = 0  # events without a vector (not in the kNN vote until embedded)
        self._tools: dict[str, int] = {}
        self._tool_at: list[float] = []  # per tool, its latest event's time
        self._tool_events: list[int] = []  # per tool, its events
        self._principals: dict[str, int] = {}
        self._words: list[dict[int, dict[str, int]]] = []  # per tool: principal -> word -> events
        self._asked = Asked.empty()  # as of the last state()
        self._asked_new = array("q")  # (words_key, tool, principal) triples added since, flat
        # one vector row per (principal, query text), by hash((principal, text)); its tools and
        # their event counts as of the last state(), and the (row, tool) uses added since, flat
        self._row_of: dict[int, int] = {}
        self._rows_tool = RowTools.empty()
        self._row_uses = array("q")
        self._rows_principal: list[int] = []
        self._rows_at: list[float] = []
        # copy on write: the dicts created or copied since the last state() (the others are
        # shared with published states and never changed in place)
        self._own_words: set[int] = set()
        self._own_counts: set[tuple[int, int]] = set()
        self._vecs = np.zeros((0, 0), dtype=np.float32)  # exact-scan rows; empty once in hnswlib
        self._q8 = np.zeros((0, 0), dtype=np.int8)
        self._scale = np.zeros(0, dtype=np.float32)
        self._dim = 0
        self._n_rows = 0
        self._hnsw: HnswStore | None = None
        self.version = getattr(self, "version", 0) + 1

    def add(self, events: Sequence[UsageEvent]) -> None:
        """Append events (a vector, when present, must be normalised and of one model)."""
        new_vecs: list[np.ndarray] = []
        for e in events:
            self.n_events += 1
            t = self._tools.setdefault(e.tool, len(self._tools))
            if t == len(self._tool_at):
                self._tool_at.append(e.at)
                self._tool_events.append(0)
            self._tool_at[t] = max(self._tool_at[t], e.at)
            self._tool_events[t] += 1
            p = self._principals.setdefault(e.principal, len(self._principals))
            if t == len(self._words):
                self._words.append({})
                self._own_words.add(t)
            words = frozenset(sys.intern(w) for w in tokenize(e.query))  # one copy of each word
            key = words_key(words)
            self._asked_new.extend((key, t, p))
            per = self._owned(self._words, t, self._own_words)
            counts = self._owned(per, p, self._own_counts, (t, p))
            for w in words:
                counts[w] = counts.get(w, 0) + 1
            if e.vector is None:
                self.missing += 1
                continue
            row_key = hash((p, e.query))
            r = self._row_of.get(row_key)
            if r is None:
                r = self._row_of[row_key] = len(self._rows_principal)
                new_vecs.append(np.asarray(e.vector, dtype=np.float32))
                self._rows_principal.append(p)
                self._rows_at.append(e.at)
            else:
                self._rows_at[r] = max(self._rows_at[r], e.at)
            self._row_uses.extend((r, t))
        if new_vecs:
            self._append_vectors(np.stack(new_vecs))
        self.version += 1

    @staticmethod
    def _owned(items: MutableMapping[Any, dict[_K, _V]] | list[dict[_K, _V]], key: Any, own: set[Any],
               mark: object = None) -> dict[_K, _V]:
        """items[key], a dict (made when absent), copied first if a published state may hold
        it: the one copy-on-write step. `own` remembers what was copied since the last
        `state()`, as `mark` (default: `key`)."""
        mark = key if mark is None else mark
        if mark not in own:
            if isinstance(items, list) or key in items:
                items[key] = dict(items[key])
            else:
                items[key] = {}
            own.add(mark)
        return items[key]

    def _append_vectors(self, vecs: np.ndarray) -> None:
        self._dim = vecs.shape[1]
        if self._hnsw is not None:
            self._append_q8(vecs, self._n_rows)
            self._hnsw.add(vecs)  # labels are row numbers: added in row order, never deleted
        elif self._n_rows + vecs.shape[0] >= HNSW_MIN_EVENTS:
            held = np.concatenate([self._vecs[: self._n_rows], vecs]) if self._n_rows else vecs
            self._append_q8(held, 0)
            # past queries cluster tightly (repeats, paraphrases): a cheaper build loses no recall
            self._hnsw = HnswStore(held.shape[1], capacity=held.shape[0], ef_construction=HNSW_EF_CONSTRUCTION,
                                   basis=principal_basis(held, PROJ_DIMS))
            self._hnsw.add(held)
            self._vecs = np.zeros((0, vecs.shape[1]), dtype=np.float32)  # published states keep theirs
        else:
            self._vecs = grown(self._vecs, self._n_rows, vecs.shape[0], vecs.shape[1:])
            self._vecs[self._n_rows : self._n_rows + vecs.shape[0]] = vecs
        self._n_rows += vecs.shape[0]

    def _append_q8(self, vecs: np.ndarray, n: int) -> None:
        """Rows n.. of the int8 copy (row i = q8[i] x scale[i])."""
        add = vecs.shape[0]
        self._q8 = grown(self._q8, n, add, vecs.shape[1:])
        self._scale = grown(self._scale, n, add, ())
        for s in range(0, add, 4096):  # in slices: no float copy of every row at once
            part = vecs[s : s + 4096]
            scale = np.maximum(np.abs(part).max(axis=1), 1e-12) / 127.0
            self._q8[n + s : n + s + part.shape[0]] = np.rint(part / scale[:, None])
            self._scale[n + s : n + s + part.shape[0]] = scale

    def state(self, now: float) -> LearnedState:
        """The immutable state of the events held, their weights decayed to `now`."""
        if not self.n_events:
            return empty_state(self.version)
        n = self._n_rows
        age_days = np.maximum(0.0, now - np.asarray(self._rows_at, dtype=np.float64)) / 86400.0
        self._own_words.clear()
        self._own_counts.clear()
        if self._row_uses:
            uses = np.frombuffer(self._row_uses, dtype=np.int64).reshape(-1, 2)
            self._rows_tool = self._rows_tool.merged(uses, len(self._rows_principal))
            self._row_uses = array("q")
        if self._asked_new:
            self._asked = self._asked.merged(np.frombuffer(self._asked_new, dtype=np.int64).reshape(-1, 3))
            self._asked_new = array("q")
        return LearnedState(
            version=self.version, tools=tuple(self._tools),
            vecs=self._vecs[:n] if self._hnsw is None else self._vecs, dim=self._dim,
            row_tools=self._rows_tool,
            ev_principal=np.asarray(self._rows_principal, dtype=np.int64),
            weight=np.power(0.5, age_days / self.half_life_days).astype(np.float32),
            principals=dict(self._principals), words=tuple(self._words), asked=self._asked,
            events=self.n_events, tool_at=tuple(self._tool_at), tool_events=tuple(self._tool_events),
            hnsw=self._hnsw, rows=n,
            q8=self._q8 if self._hnsw is not None else None,
            scale=self._scale if self._hnsw is not None else None,
        )


def build_state(events: Sequence[UsageEvent], *, now: float, half_life_days: float = HALF_LIFE_DAYS) -> LearnedState:
    """The state of `events` at time `now` (a fresh LearningIndex)."""
    idx = LearningIndex(half_life_days)
    idx.add(events)
    return idx.state(now)


def neighbours(state: LearnedState, qvec: np.ndarray, k: int = KNN) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cosine similarities) of the `k` past queries nearest `qvec`, best first."""
    m = state.rows
    if m == 0 or state.dim != qvec.shape[0]:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    k = min(k, m)
    if state.hnsw is None:
        sims = state.vecs @ qvec
        top = fusion.top_indices(sims, k)
        return top, sims[top]
    assert state.q8 is not None and state.scale is not None
    # rows added after this state was published are filtered out (the store is shared)
    newer = state.hnsw.next_label > m
    cand, _ = state.hnsw.search(qvec, max(RESCORE, k), ef=max(RESCORE, k),
                                filter=(lambda label: label < m) if newer else None)
    if cand.shape[0] < k:  # fewer than k reachable: score them all
        cand = np.arange(m, dtype=np.int64)
    sims = np.minimum((state.q8[cand] @ qvec) * state.scale[cand], 1.0)  # rounding can pass 1
    top = fusion.top_indices(sims, k)
    rows, sims = cand[top], sims[top].astype(np.float32)
    order = np.lexsort((rows, -sims))
    return rows[order], sims[order]


def signals(
    state: LearnedState, tokens: list[str], qvec: np.ndarray | None, principal: str | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vote share, lexical coverage, repeat) per tool of `state.tools` for one query by
    `principal`; `repeat`: a past query that counts (see the module docstring) has this
    query's words, or a cosine of at least STRONG_SIM to it."""
    n = len(state.tools)
    own = state.principals.get(principal, -1) if principal is not None else -1
    vote = np.zeros(n, dtype=np.float32)
    repeat = np.zeros(n, dtype=bool)
    repeat[repeats(state, tokens, principal)] = True
    if qvec is not None and state.rows:
        others = len(state.principals) > (1 if own >= 0 else 0)
        rows, sims = neighbours(state, qvec, max(KNN, AGREE_K) if others else KNN)
        near = rows[sims >= SIM_FLOOR]  # where others' agreement is counted
        vote_ = sims[:KNN] >= SIM_FLOOR
        rows, sims = rows[:KNN][vote_], sims[:KNN][vote_]
        # accumulated in Python floats, written to the arrays once (numpy item updates cost
        # more than the rest of this loop)
        acc: dict[int, float] = {}
        strong: set[int] = set()
        best: dict[tuple[int, int], float] = {}
        ends, tools, counts = state.row_tools.of_rows(rows)
        begin = 0
        for s, weight, p, end in zip(sims.tolist(), state.weight[rows].tolist(), state.ev_principal[rows].tolist(), ends):
            w = weight * (s - SIM_FLOOR) / (1.0 - SIM_FLOOR)
            for t, count in zip(tools[begin:end], counts[begin:end]):
                if p == own:
                    acc[t] = acc.get(t, 0.0) + w * count
                    if s >= STRONG_SIM:
                        strong.add(t)
                else:  # another principal: its best neighbour per tool, once
                    best[(p, t)] = max(best.get((p, t), 0.0), w)
            begin = end
        agree: list[int] = []
        if best:
            theirs = near[state.ev_principal[near] != own]
            agree = state.row_tools.backers(theirs, state.ev_principal[theirs], n).tolist()
        strong_w = (STRONG_SIM - SIM_FLOOR) / (1.0 - SIM_FLOOR)
        for (_, t), w in best.items():
            if agree[t] >= MIN_PRINCIPALS:
                acc[t] = acc.get(t, 0.0) + w
                if w >= strong_w:
                    strong.add(t)
        if acc:
            vote[list(acc)] = np.fromiter(acc.values(), dtype=np.float32, count=len(acc))
        if strong:
            repeat[list(strong)] = True
        total = float(vote.sum())
        if total > 0:
            vote /= max(total, 1.0)
    lex = state.lexical(own)
    scores = lex.scores(tokens) if n else np.zeros(0, dtype=np.float32)
    ceiling = lex.ceiling(tokens) if tokens else 0.0
    cover = (scores / ceiling).astype(np.float32) if ceiling > 0 else np.zeros(n, dtype=np.float32)
    return vote, cover, repeat


def repeats(state: LearnedState, tokens: list[str], principal: str | None) -> list[int]:
    """Tools (indexes into `state.tools`) that a past query of these very words led to, where
    it counts: `principal`'s own, or one at least MIN_PRINCIPALS others asked."""
    own = state.principals.get(principal, -1) if principal is not None else -1
    asked = state.asked.of(words_key(tokens)) if tokens else {}
    return [t for t, who in asked.items() if own in who or len(who) >= MIN_PRINCIPALS]


def rerank(
    state: LearnedState, tool_pos: np.ndarray, base: np.ndarray, cand: np.ndarray, tokens: list[str],
    qvec: np.ndarray | None, principal: str | None, k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The top `k` of `cand` (positions, their zero-shot scores `base`, best first) after the
    learned stage: (positions, scores). `tool_pos`: the snapshot position of each of
    `state.tools` (`LearnedState.positions`). Tools not in `cand` get no boost and never enter.
    The guard keeps tools without feedback, and `weak` ones, at their zero-shot rank."""
    if state.empty or cand.shape[0] == 0:
        top = fusion.top_indices(base, k)
        return cand[top], base[top]
    vote, cover, repeat = signals(state, tokens, qvec, principal)
    boost = KNN_WEIGHT * vote + LEX_WEIGHT * cover
    score = base.astype(np.float32).copy()
    fed = np.zeros(cand.shape[0], dtype=bool)
    strong = np.zeros(cand.shape[0], dtype=bool)
    # cand is sorted (every allowed position, or a union of pools): find each tool's slot
    at = np.searchsorted(cand, tool_pos)
    hit = (tool_pos >= 0) & (at < cand.shape[0])
    hit[hit] = cand[at[hit]] == tool_pos[hit]
    score[at[hit]] += boost[hit]
    fed[at[hit & ~state.weak()]] = True
    strong[at[hit]] = repeat[hit]
    depth = max(k, GUARD_DEPTH)
    learned = fusion.top_indices(score, depth)
    zero = fusion.top_indices(base, GUARD_DEPTH)
    order = fusion.guard(learned.tolist(), zero.tolist(), fed, strong)[:k]
    out = np.array(order, dtype=np.int64)
    return cand[out], score[out]


__all__ = ["GUARD_DEPTH", "KNN", "LearnedState", "LearningIndex", "build_state", "empty_state", "repeats", "rerank",
           "signals"]
