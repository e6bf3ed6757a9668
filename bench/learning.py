"""Retrieval that learns from use (issue 17): every protocol of the issue's table in one run.

    python bench/learning.py [--quick]

In process, through the daemon's own ranking code (rank.rank in mode "learned" over a
LearningIndex state, as Engine.search and `toolatlas eval --feedback` run it), with the query
vectors embedded once and cached in bench/out/cache/ (the first run embeds the 16,893
ToolLens train queries: minutes on two cores; later runs take a few minutes). Tuning used
ToolLens train only (split further for validation); every figure here is on the test split
(queries.jsonl), or on MCPToolBench++ as an unseen catalog. Prints JSON, writes
bench/out/learning.json and, when matplotlib is installed, bench/out/learning_curve.png.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "daemon"))

from _common import OUT, emit  # noqa: E402
from toolatlas.evaluation import metrics  # noqa: E402
from toolatlas.evaluation.datasets import Query, benchdata_dir, load_catalog, load_queries  # noqa: E402
from toolatlas.evaluation.feedback import EVAL_PRINCIPAL, embed_queries, feedback_events  # noqa: E402
from toolatlas.retrieval import learned, rank  # noqa: E402
from toolatlas.retrieval.engine import Engine  # noqa: E402
from toolatlas.retrieval.learned import LearnedState, LearningIndex, empty_state  # noqa: E402
from toolatlas.retrieval.usage import UsageEvent  # noqa: E402

K = 5
SEEDS = (0, 1, 2)
# The protocol rows scan past queries exactly (an hnswlib build of 17k vectors takes ~40 s
# here, and a dozen states are built); the cost row builds the daemon's hnswlib index.
EXACT = 10**9
PAUSE_S = 1.0  # before each block of the socket row: four times hostload.SAMPLE_S


class Bench:
    """One catalog: its engine (for the snapshot), queries and their cached vectors."""

    def __init__(self, ds: str) -> None:
        self.ds = ds
        self.docs, self.key_of = load_catalog(benchdata_dir() / ds / "catalog.jsonl")
        self.engine = Engine(state_dir=None, cache_size=0, persist=False)
        self.engine.load()
        self.engine.update(self.docs, [])
        self.snap = self.engine._snap
        self.names = frozenset(d.name for d in self.docs)

    def queries(self, fname: str) -> tuple[list[Query], np.ndarray]:
        qs = load_queries(benchdata_dir() / self.ds / fname, self.key_of)
        cache = OUT / "cache" / f"{self.ds}-{fname}-{self.engine.stats()['query_embedder'].replace('/', '_')}.npy"
        if cache.exists():
            vecs = np.load(cache)
            if vecs.shape[0] == len(qs):
                return qs, vecs
        t0 = time.perf_counter()
        vecs = embed_queries(self.engine, qs)
        assert vecs is not None
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, vecs)
        print(f"embedded {len(qs)} {self.ds} {fname} queries in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        return qs, vecs

    def state(self, qs: list[Query], vecs: np.ndarray, events: list[UsageEvent] | None = None) -> LearnedState:
        print(f"  state of {len(events) if events is not None else len(qs)} ...", file=sys.stderr, flush=True)
        idx = LearningIndex()
        idx.add(events if events is not None else feedback_events(qs, vecs, self.engine.space))
        return idx.state(0.0)

    def ranked(self, q: Query, vec: np.ndarray, state: LearnedState | None, k: int = K,
               principal: str = EVAL_PRINCIPAL) -> list[str]:
        assert self.snap is not None
        mode = "hybrid" if state is None else "learned"
        pos, _ = rank.rank(rank.QueryScores(self.snap, q.text, vec, None), k, None, mode, state=state,
                           principal=principal)
        return [self.snap.docs[p].name for p in pos]

    def score(self, qs: list[Query], vecs: np.ndarray, state: LearnedState | None,
              principal: str = EVAL_PRINCIPAL) -> dict[str, float]:
        r = n = 0.0
        for q, v in zip(qs, vecs):
            got = self.ranked(q, v, state, principal=principal)
            r += metrics.recall_at(got, q.relevant, K)
            n += metrics.ndcg_at(got, q.relevant, K)
        m = max(len(qs), 1)
        return {"recall@5": round(r / m, 4), "ndcg@5": round(n / m, 4), "queries": len(qs)}


def _subset(qs: list[Query], vecs: np.ndarray, idx: np.ndarray | list[int]) -> tuple[list[Query], np.ndarray]:
    idx = list(idx)
    return [qs[i] for i in idx], vecs[idx]


def toollens(b: Bench, quick: bool, only: set[str]) -> dict[str, Any]:
    train, tv = b.queries("queries-train.jsonl")
    test, sv = b.queries("queries.jsonl")
    rows: dict[str, Any] = {}
    if only:
        if "cold" in only:
            rows["cold_tools"] = _cold(b, train, tv, test, sv, SEEDS[: 1 if quick else 3])
        if "cost" in only:
            rows["cost"] = _cost(b, train, tv, test, sv)
        if "few" in only:
            rows["few_events_among_full"] = _few_among_full(b, train, tv, test, sv, SEEDS[: 1 if quick else 3])
        if "poison" in only:
            honest = _honest(b, train, tv)
            rows["poisoning"] = _poison(b, train, tv, test, sv, b.state(train, tv), honest)
            rows["poisoning_chosen_tool"] = _poison_chosen(b, train, tv, test, sv, SEEDS[: 1 if quick else 3], honest)
        if "socket" in only:
            rows["socket"] = _socket(b, train, tv)
        if "curve" in only:
            rows["zero_shot"] = b.score(test, sv, None)
            rows["curve"] = _curve(b, train, tv, test, sv, quick)
        return rows
    zero = b.score(test, sv, None)
    rows["zero_shot"] = zero
    # empty usage store: the learned ranker's top 5 equals the zero-shot one on every query
    same = sum(b.ranked(q, v, empty_state()) == b.ranked(q, v, None) for q, v in zip(test, sv))
    rows["empty_store_identical_queries"] = {"identical": same, "of": len(test)}
    full_state = b.state(train, tv)
    rows["full_label"] = b.score(test, sv, full_state)
    rng_fracs: dict[str, Any] = {}
    for frac in (0.10, 0.01):
        per = []
        for seed in SEEDS[: 1 if quick else 3]:
            pick = np.random.default_rng(seed).permutation(len(train))[: int(frac * len(train))]
            per.append(b.score(test, sv, b.state(*_subset(train, tv, pick)))["recall@5"])
        rng_fracs[f"{int(frac * 100)}%"] = {"recall@5_per_seed": per, "recall@5_mean": round(statistics.fmean(per), 4)}
    rows["fraction_of_train"] = rng_fracs
    # 20 % of events point at a random wrong tool
    rng = np.random.default_rng(7)
    names = sorted(b.names)
    events = feedback_events(train, tv, b.engine.space)
    noisy = [replace(e, tool=names[rng.integers(len(names))]) if rng.random() < 0.2 else e for e in events]
    rows["noise_20pct"] = b.score(test, sv, b.state(train, tv, noisy))
    rows["noise_20pct"]["delta_vs_clean"] = round(rows["noise_20pct"]["recall@5"] - rows["full_label"]["recall@5"], 4)
    # test queries with no train query above cosine 0.8
    far = [i for i in range(len(test)) if float((tv @ sv[i]).max()) <= 0.8]
    fq, fv = _subset(test, sv, far)
    rows["no_near_train_query"] = {"zero_shot": b.score(fq, fv, None), "learned": b.score(fq, fv, full_state)}
    print(json.dumps(rows), file=sys.stderr, flush=True)
    rows["shown_only"] = _shown_only(b, train, tv, test, sv, 1 if quick else 4)
    rows["cold_tools"] = _cold(b, train, tv, test, sv, SEEDS[: 1 if quick else 3])
    rows["few_events_per_tool"] = _few(b, train, tv, test, sv, zero)
    rows["few_events_among_full"] = _few_among_full(b, train, tv, test, sv, SEEDS[: 1 if quick else 3])
    honest = _honest(b, train, tv)
    rows["poisoning"] = _poison(b, train, tv, test, sv, full_state, honest)
    rows["poisoning_chosen_tool"] = _poison_chosen(b, train, tv, test, sv, SEEDS[: 1 if quick else 3], honest)
    print(json.dumps(rows), file=sys.stderr, flush=True)
    rows["cost"] = _cost(b, train, tv, test, sv)
    rows["curve"] = _curve(b, train, tv, test, sv, quick)
    return rows


def _shown_only(b: Bench, train: list[Query], tv: np.ndarray, test: list[Query], sv: np.ndarray,
                rounds: int) -> dict[str, Any]:
    """Each round ranks every train query with the feedback so far; the relevant tools it
    showed in its top 5 are executed (distinct (query, tool) events accumulate)."""
    seen: dict[tuple[int, str], UsageEvent] = {}
    state: LearnedState = empty_state()
    out = {}
    for r in range(1, rounds + 1):
        for i, (q, v) in enumerate(zip(train, tv)):
            for tool in set(b.ranked(q, v, state)) & q.relevant:
                seen.setdefault((i, tool), UsageEvent(query=q.text, tool=tool, principal=EVAL_PRINCIPAL, at=0.0,
                                                      vector=v, space=b.engine.space))
        state = b.state(train, tv, list(seen.values()))
        out[f"round_{r}"] = {**b.score(test, sv, state), "events": len(seen)}
    return out


def _cold(b: Bench, train: list[Query], tv: np.ndarray, test: list[Query], sv: np.ndarray,
          seeds: tuple[int, ...]) -> dict[str, Any]:
    """A seeded 30 % of tools gets no feedback (every train query naming one is dropped);
    R@5 on the test queries of those tools, zero-shot against learned."""
    names = sorted(b.names)
    out = {}
    for seed in seeds:
        cold = set(np.random.default_rng(seed).permutation(names)[: int(0.3 * len(names))].tolist())
        keep = [i for i, q in enumerate(train) if not (q.relevant & cold)]
        tq, tvv = _subset(train, tv, keep)
        ids = [i for i, q in enumerate(test) if q.relevant & cold]
        eq, ev = _subset(test, sv, ids)
        base = b.score(eq, ev, None)
        state = b.state(tq, tvv)
        learned = b.score(eq, ev, state)
        # the cold tools alone: are they still found (the guard's promise)?
        cold_only = [replace(q, relevant=q.relevant & cold) for q in eq]
        c0, c1 = b.score(cold_only, ev, None), b.score(cold_only, ev, state)
        out[f"seed_{seed}"] = {"zero_shot": base, "learned": learned,
                               "delta": round(learned["recall@5"] - base["recall@5"], 4),
                               "cold_tools_only": {"zero_shot": c0["recall@5"], "learned": c1["recall@5"],
                                                   "delta": round(c1["recall@5"] - c0["recall@5"], 4)}}
    return out


def _few(b: Bench, train: list[Query], tv: np.ndarray, test: list[Query], sv: np.ndarray,
         zero: dict[str, float]) -> dict[str, Any]:
    """Each tool gets only n events (n of its train queries, for that tool alone); R@5 over
    every test query against zero-shot."""
    by_tool: dict[str, list[int]] = {}
    for i, q in enumerate(train):
        for t in q.relevant:
            by_tool.setdefault(t, []).append(i)
    out = {}
    rng = np.random.default_rng(3)
    for n in (1, 3, 10):
        events = []
        for tool, ids in sorted(by_tool.items()):
            for i in rng.permutation(ids)[:n]:
                events.append(UsageEvent(query=train[i].text, tool=tool, principal=EVAL_PRINCIPAL, at=0.0,
                                         vector=tv[i], space=b.engine.space))
        got = b.score(test, sv, b.state(train, tv, events))
        out[f"{n}_events"] = {**got, "delta": round(got["recall@5"] - zero["recall@5"], 4), "events": len(events)}
    return out


def _few_among_full(b: Bench, train: list[Query], tv: np.ndarray, test: list[Query], sv: np.ndarray,
                    seeds: tuple[int, ...]) -> dict[str, Any]:
    """The issue's row "tools with 1, 3 and 10 feedback events: their other test queries":
    a seeded 30 % of tools keeps only n of its train events (n = 1, 3, 10; fewer where it has
    fewer), every other tool all of them (full-label feedback otherwise). R@5 of those few
    tools alone on their test queries (each query's relevant set cut to its few tools, as the
    cold row's `cold_tools_only`), zero-shot against learned; and R@5 of those queries with
    every relevant tool. Shows whether a tool with a little feedback is buried by tools with
    much (until learned.WEAK_SHARE the guard protected only tools with none)."""
    names = sorted(b.names)
    out: dict[str, Any] = {}
    for seed in seeds:
        rng = np.random.default_rng(seed)
        few = set(rng.permutation(names)[: int(0.3 * len(names))].tolist())
        uses: dict[str, list[int]] = {}
        for i, q in enumerate(train):
            for t in sorted(q.relevant & few):
                uses.setdefault(t, []).append(i)
        order = {t: rng.permutation(ids).tolist() for t, ids in sorted(uses.items())}
        ids = [i for i, q in enumerate(test) if q.relevant & few]
        eq, ev = _subset(test, sv, ids)
        few_only = [replace(q, relevant=q.relevant & few) for q in eq]
        zero_few, zero_all = b.score(few_only, ev, None), b.score(eq, ev, None)
        per: dict[str, Any] = {"few_tools": len(few), "test_queries": len(eq),
                               "zero_shot": {"few_tools_only": zero_few["recall@5"], "all_relevant": zero_all["recall@5"]}}
        for n in (1, 3, 10):
            kept = {(i, t) for t, ids_ in order.items() for i in ids_[:n]}
            cut = [replace(q, relevant=frozenset(t for t in q.relevant if t not in few or (i, t) in kept))
                   for i, q in enumerate(train)]
            events = feedback_events(cut, tv, b.engine.space)
            state = b.state(train, tv, events)
            got_few, got_all = b.score(few_only, ev, state), b.score(eq, ev, state)
            per[f"{n}_events"] = {"few_tools_only": got_few["recall@5"], "all_relevant": got_all["recall@5"],
                                  "delta_few_tools_only": round(got_few["recall@5"] - zero_few["recall@5"], 4),
                                  "events": len(events)}
        out[f"seed_{seed}"] = per
        print(json.dumps({f"few seed {seed}": per}), file=sys.stderr, flush=True)
    return out


def _honest(b: Bench, train: list[Query], tv: np.ndarray) -> tuple[list[UsageEvent], LearnedState]:
    """Full-label train feedback split round-robin among 10 principals, and its state."""
    honest = [replace(e, principal=f"honest{i % 10}") for i, e in enumerate(feedback_events(train, tv, b.engine.space))]
    return honest, b.state(train, tv, honest)


def _poison(b: Bench, train: list[Query], tv: np.ndarray, test: list[Query], sv: np.ndarray,
            full_state: LearnedState, honest: tuple[list[UsageEvent], LearnedState]) -> dict[str, Any]:
    """Honest feedback from 10 principals (`_honest`); one more principal floods the 500 train
    queries nearest a target test query with a wrong tool. As an 11th principal: how often the
    wrong tool reaches the top 5 of the 100 test queries nearest the target, and of the rest."""
    space = b.engine.space
    events, clean = honest
    rng = np.random.default_rng(11)
    target = int(rng.integers(len(test)))
    wrong = sorted(b.names - test[target].relevant)[int(rng.integers(len(b.names) - 5))]
    near_train = np.argsort(-(tv @ sv[target]))[:500]
    flood = [UsageEvent(query=train[i].text, tool=wrong, principal="mallory", at=0.0, vector=tv[i], space=space)
             for i in near_train]
    state = b.state(train, tv, events + flood)
    order = np.argsort(-(sv @ sv[target]))
    near, rest = order[:100], order[100:]

    def rate(ids: np.ndarray) -> float:
        hits = sum(wrong in b.ranked(test[i], sv[i], state, principal="victim") for i in ids)
        return round(hits / max(len(ids), 1), 4)

    capped = b.score(test, sv, clean, principal="victim")
    return {
        "wrong_tool_in_top5_nearest_100": rate(near), "wrong_tool_in_top5_rest": rate(rest),
        "full_label_10_honest_principals": capped,
        "full_label_own_events": {"recall@5": _full_recall(b, test, sv, full_state)},
        "cap_cost": round(_full_recall(b, test, sv, full_state) - capped["recall@5"], 4),
    }


CHOSEN_NEAR = 80  # the daemon's learned.AGREE_K; fixed, so a run with --agree-k faces the same flood


def _poison_chosen(b: Bench, train: list[Query], tv: np.ndarray, test: list[Query], sv: np.ndarray,
                   seeds: tuple[int, ...], honest: tuple[list[UsageEvent], LearnedState]) -> dict[str, Any]:
    """The flood of `_poison` with a chosen wrong tool: the one the honest principals used
    most after the CHOSEN_NEAR train queries nearest the target, not one of the target's.
    Such a tool has the agreement the flooder's vote needs. Per seed: how often it is in the
    top 5 of the target's 100 nearest test queries and of the rest, with the flood and
    without it (the honest events alone)."""
    space = b.engine.space
    events, clean = honest
    out: dict[str, Any] = {}
    for seed in seeds:
        target = int(np.random.default_rng(100 + seed).integers(len(test)))
        nearest = np.argsort(-(tv @ sv[target]))
        used: dict[str, int] = {}
        for i in nearest[:CHOSEN_NEAR]:
            for t in train[i].relevant - test[target].relevant:
                used[t] = used.get(t, 0) + 1
        wrong = max(sorted(used), key=lambda t: used[t])
        flood = [UsageEvent(query=train[i].text, tool=wrong, principal="mallory", at=0.0, vector=tv[i], space=space)
                 for i in nearest[:500]]
        state = b.state(train, tv, events + flood)
        order = np.argsort(-(sv @ sv[target]))

        def rate(ids: np.ndarray, st: LearnedState) -> float:
            return round(sum(wrong in b.ranked(test[i], sv[i], st, principal="victim") for i in ids) / len(ids), 4)

        got = {"near_flood": rate(order[:100], state), "near_honest_only": rate(order[:100], clean),
               "rest_flood": rate(order[100:], state), "rest_honest_only": rate(order[100:], clean)}
        out[f"seed_{seed}"] = {"wrong_tool_uses_nearby": used[wrong], **got,
                               "near_uplift": round(got["near_flood"] - got["near_honest_only"], 4),
                               "rest_uplift": round(got["rest_flood"] - got["rest_honest_only"], 4)}
    return out


def _full_recall(b: Bench, test: list[Query], sv: np.ndarray, state: LearnedState) -> float:
    return b.score(test, sv, state)["recall@5"]


def _cost(b: Bench, train: list[Query], tv: np.ndarray, test: list[Query], sv: np.ndarray) -> dict[str, Any]:
    """Extra ranking time per query (median over a sample of test queries, in process, the
    query vector given, zero-shot and learned alternated, two passes) with every train
    query's events in the daemon's hnswlib index; and the memory of the usage state: what
    tracemalloc sees the LearningIndex and its published state (with the lexical documents
    the daemon prebuilds) keep, Python objects and numpy arrays, plus hnswlib's native memory
    (HnswStore.native_bytes; tracemalloc cannot see it). The events arrive as the daemon's
    store hands them over, each with its own vector; the build runs under tracemalloc (slower)."""
    learned.HNSW_MIN_EVENTS = _HNSW_MIN
    events = [replace(e, vector=np.array(e.vector, dtype=np.float32))
              for e in feedback_events(train, tv, b.engine.space)]
    gc.collect()
    tracemalloc.start()
    t0 = time.perf_counter()
    idx = LearningIndex()
    idx.add(events)
    state = idx.state(0.0)
    for own in (-1, state.principals.get(EVAL_PRINCIPAL, -1)):
        state.lexical(own)
    build_s = time.perf_counter() - t0
    del events
    gc.collect()
    python_bytes, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    native = state.hnsw.native_bytes() if state.hnsw is not None else 0
    learned.HNSW_MIN_EVENTS = EXACT
    sample = list(range(0, len(test), max(1, len(test) // 400)))
    zero_t, learned_t = [], []
    for _ in range(2):
        for i in sample:
            t0 = time.perf_counter()
            b.ranked(test[i], sv[i], None)
            t1 = time.perf_counter()
            b.ranked(test[i], sv[i], state)
            learned_t.append(time.perf_counter() - t1)
            zero_t.append(t1 - t0)
    return {
        "events": state.events, "vector_rows": state.rows, "hnsw": state.hnsw is not None,
        "build_s_under_tracemalloc": round(build_s, 1),
        "zero_shot_median_ms": round(statistics.median(zero_t) * 1000, 3),
        "learned_median_ms": round(statistics.median(learned_t) * 1000, 3),
        "extra_median_ms": round((statistics.median(learned_t) - statistics.median(zero_t)) * 1000, 3),
        "state_mb": round((python_bytes + native) / 2**20, 1),
        "python_mb": round(python_bytes / 2**20, 1), "hnswlib_native_mb": round(native / 2**20, 1),
        "build_peak_python_mb": round(peak / 2**20, 1), "index_events": idx.n_events,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "socket_p95_at_2000_tools": "bench/learning.py --only socket",
    }


def _socket(b: Bench, train: list[Query], tv: np.ndarray, rounds: int = 2, blocks: int = 4,
            block_queries: int = 150) -> dict[str, Any]:
    """`tool_search` p95 over the Unix socket at 2,000 tools (search_latency.py's synthetic
    upstream: the two dev catalogs replicated), learning off against learning on with every
    ToolLens train event (44,865, the caller's own, vectors stored) seeded into the usage store
    before the start. Each round starts both daemons side by side and, once both are settled
    (the index, and with learning on a learned state holding every event), times `blocks`
    blocks of `block_queries` distinct real queries on each, the sides alternating block by
    block (off first, then on first, ...): the host's speed, which drifts by tens of percent
    within minutes here, is nearly the same for both sides of each block. One side works at a
    time, after a pause longer than the query embedder's look at other processes' load
    (embed.cores_idle_for, hostload.SAMPLE_S), so neither side's threading choice sees the
    other's work. "miss" = a query's first time on that daemon (result-cache and query-vector
    misses), "hit" = the first two blocks' queries again. Each side also gives the mean size
    of a miss's answer and how many distinct tools the misses showed: with learning on the
    top 5 are other tools, and a tool's first showing sanitizes its description and schema
    (gateway/matches.py)."""
    from contextlib import ExitStack

    from catalog_upstream import CATALOGS, catalog_tools, upstream_block
    from search_latency import bench_queries
    from tests.support.daemon import Daemon
    from toolatlas.catalog.catalog_file import read_catalog
    from toolatlas.retrieval.usage import open_store
    from toolatlas.surface.rawclient import RawClient

    from _common import pct_ms, wait_settled

    size = 2000
    tools = catalog_tools(size)
    records = [line for path in CATALOGS for line in read_catalog(path)]
    daemon_name = {(r.server, r.name): "cat00__" + tools[i]["name"] for i, r in enumerate(records[:size])}
    doc_key = {name: key for key, name in b.key_of.items()}
    principal = f"uid:{os.getuid()}"
    now = time.time()
    events, vecs = [], []
    for q, v in zip(train, tv):
        for tool in sorted(q.relevant):
            events.append(UsageEvent(query=q.text, tool=daemon_name[doc_key[tool]], principal=principal, at=now))
            vecs.append(v)
    queries = bench_queries(blocks * block_queries)
    out: dict[str, Any] = {"tools": size, "events_seeded": len(events), "queries": len(queries), "runs": []}

    def start(stack: ExitStack, on: bool) -> Daemon:
        tmp = Path(tempfile.mkdtemp(prefix="toolatlas-bench-learn-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        learning = "" if on else "[learning]\nenabled = false\n"
        d = Daemon(tmp, learning + upstream_block("cat00", size, 0, 1, "relist_interval = 0\n"),
                   search_extra='embedder = "onnx"\n')
        if on:
            store = open_store(tmp / "state")
            ids = store.add(events)
            store.set_vectors(ids, np.stack(vecs), b.engine.space or "")
            store.close()
        stack.callback(d.__exit__, None, None, None)  # safe before or after a failed start
        d.start(wait_ready=3600)
        return d

    def ready(d: Daemon, on: bool) -> bool:
        d.wait_for(lambda: (idx := d.status()["index"])["tools"] >= size and idx["degraded"] is None,
                   timeout=3600, what="indexed")
        if on:
            d.wait_for(lambda: d.status()["learning"]["events"] >= len(events), timeout=600, what="learned state")
        settled, _ = wait_settled(d.status, 120)
        return settled

    for r in range(rounds):
        with ExitStack() as stack:
            daemons = {on: start(stack, on) for on in (False, True)}
            settled = {on: ready(d, on) for on, d in daemons.items()}
            lone0 = {on: d.status()["index"]["lone_queries"] for on, d in daemons.items()}
            timed: dict[bool, dict[str, list[float]]] = {on: {"miss": [], "hit": []} for on in daemons}
            sizes: dict[bool, list[int]] = {on: [] for on in daemons}  # bytes of each miss's answer
            shown: dict[bool, set[str]] = {on: set() for on in daemons}  # tools the misses showed
            clients = {on: stack.enter_context(RawClient(d.socket, timeout=60)) for on, d in daemons.items()}
            parts = [queries[i * block_queries:(i + 1) * block_queries] for i in range(blocks)]
            for kind, todo in (("miss", parts), ("hit", parts[:2])):
                for i, block in enumerate(todo):
                    for on in ((False, True) if i % 2 == 0 else (True, False)):
                        time.sleep(PAUSE_S)
                        for q in block:
                            t = time.perf_counter()
                            res = clients[on].call_tool("tool_search", {"query": q, "top_k": K})
                            timed[on][kind].append(time.perf_counter() - t)
                            assert not res.get("isError"), res
                            if kind == "miss":
                                sizes[on].append(len(json.dumps(res)))
                                shown[on].update(m["name"] for m in (res.get("structuredContent") or {}).get("matches") or ())
            load = [round(x, 2) for x in os.getloadavg()]
            for on, d in daemons.items():
                st = d.status()
                # misses that embedded their query on the spinning two-thread session (embed.OnnxEmbedder)
                row = {"round": r, "learning": on, "learning_events": st["learning"]["events"], "settled": settled[on],
                       "lone_queries": st["index"]["lone_queries"] - lone0[on], "query_threads": st["index"]["query_threads"],
                       "answer_bytes_mean": round(statistics.mean(sizes[on])), "distinct_tools_shown": len(shown[on]),
                       "load_average": load,
                       **{f"{k}_{q}_ms": pct_ms(v, q2) for k, v in timed[on].items() for q, q2 in (("p50", 50), ("p95", 95))}}
                out["runs"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    for kind in ("miss", "hit"):
        off = statistics.median(x[f"{kind}_p95_ms"] for x in out["runs"] if not x["learning"])
        on_ = statistics.median(x[f"{kind}_p95_ms"] for x in out["runs"] if x["learning"])
        out[f"{kind}_p95_ratio_on_off"] = round(on_ / off, 3)
    return out


def _curve(b: Bench, train: list[Query], tv: np.ndarray, test: list[Query], sv: np.ndarray,
           quick: bool) -> list[dict[str, float]]:
    points = []
    perm = np.random.default_rng(0).permutation(len(train))
    for n in ((0, 1000, 16893) if quick else (0, 170, 500, 1000, 2000, 4000, 8000, 16893)):
        qs, vs = _subset(train, tv, perm[:n])
        state = b.state(qs, vs) if n else None
        points.append({"train_queries": n, "events": sum(len(q.relevant) for q in qs),
                       "recall@5": b.score(test, sv, state)["recall@5"]})
    return points


def mcp(b: Bench) -> dict[str, Any]:
    qs, vs = b.queries("queries.jsonl")
    perm = np.random.default_rng(0).permutation(len(qs))
    half = len(qs) // 2
    fq, fv = _subset(qs, vs, perm[:half])
    eq, ev = _subset(qs, vs, perm[half:])
    state = b.state(fq, fv)
    fed = {t for q in fq for t in q.relevant}
    cold = [i for i, q in enumerate(eq) if not (q.relevant & fed)]
    cq, cv = _subset(eq, ev, cold)
    return {"zero_shot": b.score(eq, ev, None), "learned": b.score(eq, ev, state),
            "cold_tools": {"zero_shot": b.score(cq, cv, None), "learned": b.score(cq, cv, state)}}


def _plot(curve: list[dict[str, float]], zero: float) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed in this environment: no PNG written"
    xs = [max(p["events"], 1) for p in curve]
    plt.figure(figsize=(6, 4))
    plt.semilogx(xs, [p["recall@5"] for p in curve], marker="o", label="learned")
    plt.axhline(zero, color="grey", linestyle="--", label="zero-shot")
    plt.xlabel("feedback events (ToolLens train)")
    plt.ylabel("R@5, ToolLens test")
    plt.legend()
    path = OUT / "learning_curve.png"
    plt.savefig(path, dpi=120, bbox_inches="tight")
    return str(path)


_HNSW_MIN = learned.HNSW_MIN_EVENTS


def main(argv: list[str] | None = None) -> int:
    learned.HNSW_MIN_EVENTS = EXACT
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="one seed, one shown-only round, a short curve")
    p.add_argument("--only", default="",
                   help="some of cold,cost,curve,few,mcp,poison,socket (default: every row but socket, which starts daemons)")
    p.add_argument("--agree-k", type=int, default=learned.AGREE_K,
                   help="learned.AGREE_K for the in-process rows (20: the agreement window before stop 59; not the socket row's daemons)")
    args = p.parse_args(argv)
    if args.agree_k < 1:
        p.error("--agree-k must be a positive number of past queries")
    learned.AGREE_K = args.agree_k
    only = {x for x in args.only.split(",") if x}
    t0 = time.perf_counter()
    tl = toollens(Bench("toollens"), args.quick, only)
    report: dict[str, Any] = {"toollens": tl}
    if not only or "mcp" in only:
        report["mcptoolbenchpp"] = mcp(Bench("mcptoolbenchpp"))
    if "curve" in tl:
        report["png"] = _plot(tl["curve"], tl["zero_shot"]["recall@5"])
    report["seconds"] = round(time.perf_counter() - t0, 1)
    emit(report, "learning" if not only else "learning-" + "-".join(sorted(only)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
