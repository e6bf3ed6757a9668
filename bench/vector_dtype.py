"""Ranking time and top-5 of float32 against int16 snapshot rows (index.COMPACT_ABOVE, rows.py),
in process, interleaved query by query over one hnswlib store (issue 19 item 3).

    PYTHONPATH=daemon .venv/bin/python bench/vector_dtype.py [--tools 20000] [--queries 300]

TOOLS synthetic tools (bench/catalog_upstream.py) in five servers; vectors are synthetic
(600 base directions plus noise, queries likewise), since only time and agreement are read.
ToolLens test queries, hybrid top 5, unscoped and scoped to one server. Prints JSON (also
bench/out/vector_dtype.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Any

import numpy as np

from _common import REPO, emit, median
from catalog_upstream import catalog_tools
from toolatlas.retrieval import index, rank
from toolatlas.retrieval.documents import ToolDoc, Vocab, make_entry
from toolatlas.retrieval.hnsw import HnswStore

DIM = 384
SERVERS = 5


def run(n: int, n_queries: int) -> dict[str, Any]:
    tools = catalog_tools(n)
    docs = [ToolDoc(name=f"s{i % SERVERS}__{t['name']}", server=f"s{i % SERVERS}", tool=t["name"],
                    description=t["description"], input_schema=t["inputSchema"]) for i, t in enumerate(tools)]
    rng = np.random.default_rng(0)
    base = rng.normal(size=(600, DIM)).astype(np.float32)
    vecs = base[[t["base"] for t in tools]] + 0.3 * rng.normal(size=(n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    store = HnswStore(DIM, capacity=n)
    store.index.set_num_threads(2)  # the build only; searches run on one thread, as in the daemon
    labels = store.add(vecs)
    store.index.set_num_threads(1)
    entries, vec_of = {}, {}
    vocab = Vocab()
    for d, v, lab in zip(docs, vecs, labels):
        e = dataclasses.replace(make_entry(d, vocab), label=int(lab))
        entries[d.name] = e
        vec_of[e.key] = v
    snaps = {}
    for side, above in (("f32", None), ("i16", 0)):
        index.COMPACT_ABOVE = above
        snaps[side] = index.build_snapshot(1, entries, vec_of, DIM, store)
    assert snaps["f32"].vecs is not None and snaps["f32"].vecs.dtype == np.float32
    assert snaps["i16"].vecs is not None and snaps["i16"].vecs.dtype == np.int16
    with open(REPO / ".." / "shared" / "benchdata" / "toollens" / "queries.jsonl") as fh:
        queries = [json.loads(line)["query"] for line in fh][:n_queries]
    qv = base[rng.integers(0, 600, len(queries))] + 0.5 * rng.normal(size=(len(queries), DIM)).astype(np.float32)
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    res: dict[str, Any] = {"bench": "vector_dtype", "tools": n, "servers": SERVERS, "queries": len(queries)}
    for scope_name, scope in (("all", None), ("one server", ("s2",))):
        times: dict[str, list[float]] = {"f32": [], "i16": []}
        same, worst = 0, 0.0
        for i, (q, v) in enumerate(zip(queries, qv)):
            out = {}
            for side in (("f32", "i16") if i % 2 else ("i16", "f32")):
                snap = snaps[side]
                t0 = time.perf_counter()
                allowed = snap.allowed(scope)
                out[side] = rank.rank(rank.QueryScores(snap, q, v, allowed), 5, scope, "hybrid")
                times[side].append(time.perf_counter() - t0)
            same += int(np.array_equal(out["f32"][0], out["i16"][0]))
            worst = max(worst, float(np.abs(np.sort(out["f32"][1]) - np.sort(out["i16"][1])).max()))
        m32, m16 = median(times["f32"]) * 1e3, median(times["i16"]) * 1e3
        res[scope_name] = {"f32_median_ms": round(m32, 3), "i16_median_ms": round(m16, 3), "ratio": round(m16 / m32, 3),
                           "same_top5": f"{same}/{len(queries)}", "top5_score_max_diff": worst}
    res["matrix_mb"] = {k: round((snap.vecs.nbytes + (0 if snap.scales is None else snap.scales.nbytes)) / 2**20, 1)
                        for k, snap in snaps.items() if snap.vecs is not None}
    res["load_1m"] = round(os.getloadavg()[0], 2)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tools", type=int, default=20000)
    p.add_argument("--queries", type=int, default=300)
    a = p.parse_args()
    emit(run(a.tools, a.queries), "vector_dtype")


if __name__ == "__main__":
    main()
