"""Ranking time and top-5 of float32 against float16 snapshot vectors (index.HALF_ABOVE), in
process, interleaved query by query over one hnswlib store (issue 19 item 3).

    PYTHONPATH=daemon .venv/bin/python bench/vector_dtype.py [TOOLS]   (default 20,000)

TOOLS synthetic tools (bench/catalog_upstream.py) in five servers; vectors are synthetic
(600 base directions plus noise, queries likewise), since only time and agreement are read.
300 ToolLens test queries, hybrid top 5, unscoped and scoped to one server. Prints JSON.
"""
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "daemon"))
sys.path.insert(0, str(REPO / "bench"))
import numpy as np  # noqa: E402
from catalog_upstream import catalog_tools  # noqa: E402
from toolatlas.retrieval import index, rank  # noqa: E402
from toolatlas.retrieval.documents import ToolDoc, make_entry  # noqa: E402
from toolatlas.retrieval.hnsw import HnswStore  # noqa: E402
N, D = int(sys.argv[1]) if len(sys.argv) > 1 else 20000, 384
tools = catalog_tools(N)
docs = [ToolDoc(name=f"s{i % 5}__{t['name']}", server=f"s{i % 5}", tool=t["name"], description=t["description"], input_schema=t["inputSchema"]) for i, t in enumerate(tools)]
rng = np.random.default_rng(0)
base = rng.normal(size=(600, D)).astype(np.float32)
vecs = base[[t["base"] for t in tools]] + 0.3 * rng.normal(size=(N, D)).astype(np.float32)
vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
store = HnswStore(D, capacity=N); store.index.set_num_threads(2); labels = store.add(vecs); store.index.set_num_threads(1)
entries, vec_of = {}, {}
for d, v, lab in zip(docs, vecs, labels):
    e = dataclasses.replace(make_entry(d), label=int(lab)); entries[d.name] = e; vec_of[e.key] = v
index.HALF_ABOVE = None; s32 = index.build_snapshot(1, entries, vec_of, D, store)
index.HALF_ABOVE = 4096; s16 = index.build_snapshot(1, entries, vec_of, D, store)
assert s32.vecs.dtype == np.float32 and s16.vecs.dtype == np.float16
qs = [json.loads(l)["query"] for l in open(REPO / ".." / "shared" / "benchdata" / "toollens" / "queries.jsonl")][:300]
qv = base[rng.integers(0, 600, len(qs))] + 0.5 * rng.normal(size=(len(qs), D)).astype(np.float32)
qv /= np.linalg.norm(qv, axis=1, keepdims=True)
res = {}
for scope_name, scope in (("all", None), ("one server", ("s2",))):
    t = {"f32": [], "f16": []}; same = 0
    for i, (q, v) in enumerate(zip(qs, qv)):
        order = ("f32", "f16") if i % 2 else ("f16", "f32")
        out = {}
        for side in order:
            snap = s32 if side == "f32" else s16
            t0 = time.perf_counter()
            allowed = snap.allowed(scope)
            out[side] = rank.rank(rank.QueryScores(snap, q, v, allowed), 5, scope, "hybrid")
            t[side].append(time.perf_counter() - t0)
        same += int(np.array_equal(out["f32"][0], out["f16"][0]))
    m32, m16 = np.median(t["f32"]) * 1e3, np.median(t["f16"]) * 1e3
    res[scope_name] = {"f32_median_ms": round(m32, 3), "f16_median_ms": round(m16, 3), "ratio": round(m16 / m32, 3),
                       "same_top5": f"{same}/{len(qs)}"}
res["n"] = N; res["load_1m"] = os.getloadavg()[0]
print(json.dumps(res))
