"""The dense branch's candidates with hnswlib over float32 vectors against over principal
coordinates (index.PROJECT_MIN, hnsw.py's basis), in process, through rank.dense (issue 19
item 3: one full copy of each vector).

    PYTHONPATH=daemon .venv/bin/python bench/dense_pool.py [--queries 400] [--sets real,synthetic]

Two document sets, ToolLens test queries as the queries:
* "real": the 16,893 ToolLens train queries as documents (distinct real texts; the vectors
  bench/learning.py caches in bench/out/cache, embedded here when absent);
* "synthetic": the 100,000-tool bench catalog's vectors as bench/memory.py and
  bench/search_latency.py seed them: each tool's base embedding plus noise, so a tool's ~195
  near-copies differ only by the noise and the exact order among them is the noise's.

Each set is indexed twice by IndexBuilder (seeded vectors: nothing embedded but the base
tools and, once, the queries): PROJECT_MIN above its size (hnswlib over float32, as before
stop 42) and at 0 (principal coordinates). For k = 200 (rank.FUSION_POOL, the pool a hybrid
search fuses) and k = 10: recall of the exact top k, the mean exact score lost a slot against
it, the median ms of one `rank.dense`; and hnswlib's native bytes. Prints JSON (also
bench/out/dense_pool.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

from _common import OUT, emit, median
from catalog_upstream import catalog_tools, tool_docs
from toolatlas.evaluation.feedback import embed_queries
from toolatlas.evaluation.datasets import benchdata_dir, load_catalog, load_queries
from toolatlas.retrieval import index, rank
from toolatlas.retrieval.documents import ToolDoc, doc_text, make_entry
from toolatlas.retrieval.engine import Engine
from toolatlas.retrieval.index import IndexBuilder

KS = (rank.FUSION_POOL, 10)


def _query_vectors(engine: Engine, fname: str) -> np.ndarray:
    """ToolLens `fname` query vectors, cached as bench/learning.py caches them."""
    _, key_of = load_catalog(benchdata_dir() / "toollens" / "catalog.jsonl")
    qs = load_queries(benchdata_dir() / "toollens" / fname, key_of)
    cache = OUT / "cache" / f"toollens-{fname}-{engine.stats()['query_embedder'].replace('/', '_')}.npy"
    if cache.exists():
        vecs = np.load(cache)
        if vecs.shape[0] == len(qs):
            return vecs
    got = embed_queries(engine, qs)
    assert got is not None
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, got)
    return got


def _synthetic(engine: Engine) -> tuple[list[ToolDoc], np.ndarray]:
    tools = catalog_tools(100_000)
    n_base = max(t["base"] for t in tools) + 1
    assert engine.embedder is not None
    base = engine.embedder.embed([doc_text(d) for d in tool_docs(tools[:n_base], "cat00")])
    rng = np.random.default_rng(100_000)  # bench/search_latency.py's seeding, one server
    vecs = base[np.asarray([t["base"] for t in tools])]
    vecs = vecs + rng.normal(0, 0.02, vecs.shape).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return tool_docs(tools, "cat00"), vecs.astype(np.float32)


def _real(engine: Engine) -> tuple[list[ToolDoc], np.ndarray]:
    vecs = _query_vectors(engine, "queries-train.jsonl")
    docs = [ToolDoc(name=f"past__q{i}", server="past", tool=f"q{i}", description=f"past query {i}",
                    input_schema={"type": "object"}) for i in range(vecs.shape[0])]
    return docs, vecs


def _snapshot(docs: list[ToolDoc], vecs: np.ndarray, project_min: int) -> tuple[Any, float]:
    index.PROJECT_MIN = project_min
    b = IndexBuilder({"embeddings_computed": 0, "embeddings_cached": 0, "embeddings_shared": 0})
    b.seed(docs, vecs)
    entries = {d.name: make_entry(d, b.vocab) for d in docs}
    t0 = time.perf_counter()
    snap, failure = b.commit(entries, [], 1, types.SimpleNamespace(dim=vecs.shape[1]))  # type: ignore[arg-type]
    assert failure is None and snap.hnsw is not None
    return snap, time.perf_counter() - t0


def measure(name: str, docs: list[ToolDoc], vecs: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    n = len(docs)
    exact = {k: [] for k in KS}
    for q in queries:
        sims = vecs @ q
        for k in KS:
            top = np.argsort(-sims, kind="stable")[:k]
            exact[k].append((set(top.tolist()), float(sims[top].mean())))
    out: dict[str, Any] = {"documents": n, "dim": int(vecs.shape[1])}
    for label, project_min in (("float32", n + 1), ("principal", 0)):
        snap, build_s = _snapshot(docs, vecs, project_min)
        row: dict[str, Any] = {"build_s": round(build_s, 2), "hnswlib_native_mb": round(snap.hnsw.native_bytes() / 2**20, 1),
                               "held_dim": snap.hnsw.held_dim}
        for k in KS:
            found, lost, times = [], [], []
            for q, (want, want_mean) in zip(queries, exact[k]):
                t0 = time.perf_counter()
                pos, sims = rank.dense(snap, q, k, None, None)
                times.append(time.perf_counter() - t0)
                found.append(len(want & set(pos.tolist())) / k)
                lost.append(want_mean - float(sims.mean()))
            row[f"k{k}"] = {"recall": round(float(np.mean(found)), 4), "score_lost_a_slot": round(float(np.mean(lost)), 5),
                            "median_ms": round(median(times) * 1e3, 3)}
        out[label] = row
        print(f"{name} {label}: {row}", file=sys.stderr, flush=True)
        del snap
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--sets", default="real,synthetic")
    args = ap.parse_args()
    engine = Engine(state_dir=Path(tempfile.mkdtemp(prefix="toolatlas-bench-pool-")), cache_size=0, persist=False)
    engine.load()
    queries = _query_vectors(engine, "queries.jsonl")[: args.queries]
    result: dict[str, Any] = {"bench": "dense_pool", "queries": int(queries.shape[0]),
                              "loadavg_start": list(os.getloadavg()), "sets": {}}
    for name in args.sets.split(","):
        docs, vecs = _real(engine) if name == "real" else _synthetic(engine)
        result["sets"][name] = measure(name, docs, vecs, queries)
    result["loadavg_end"] = list(os.getloadavg())
    emit(result, "dense_pool")


if __name__ == "__main__":
    main()
