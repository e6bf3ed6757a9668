"""Engine.search latency against catalog size, cold indexing, restart, and resident memory.

    python bench/search_latency.py [--sizes 500,2000,20000,100000] [--queries 300] [--quick]

Prints one JSON object (also written to bench/out/search_latency.json) and plots p50/p95
against catalog size into bench/out/search_latency.png.

* Catalogs are synthetic, built from the dev catalogs (toollens + mcptoolbenchpp, 513 tools):
  copy j of a tool gets a server name `<server>-<j>`, a varied tool name and a description
  with a variant phrase. Up to 2,000 tools the documents are really embedded. Embedding
  20k-100k texts takes too long on 2 cores, so for those sizes each document gets a synthetic
  vector: its base tool's real embedding plus Gaussian noise, renormalised (cosine to the
  base ~0.9); the JSON says which sizes are synthetic.
* Queries are real, distinct texts (toollens test + mcptoolbenchpp), embedded per search
  (ONNX, as the daemon does). "miss" = first time each query is seen (query cache miss,
  query embedding included), "hit" = the same queries again (query cache hit).
  "narrow_scope_miss" = one server allowed, a result-cache miss whose query vector is already
  cached (so: ranking cost inside a narrow scope); "ranking_only" = the distinct queries
  again with the result cache cleared and query vectors cached (ranking cost, full catalog).
* `measure_cold_and_restart()` indexes 2,000 tools into a fresh state_dir, then restarts a
  new Engine on it: time to first search and embeddings computed (must be 0).
* each phase runs in a fresh process and reports its VmRSS with the tools indexed.

The end-to-end variant through the daemon's Unix socket lives with the daemon's benches;
these functions are importable for it (`measure(...) -> dict`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
sys.path.insert(0, str(REPO / "daemon"))

from toolatlas.evaluation.datasets import benchdata_dir, load_catalog, load_queries  # noqa: E402
from toolatlas.retrieval.engine import Engine, ToolDoc  # noqa: E402

_VARIANTS = [
    "for teams", "batch mode", "v2 API", "enterprise edition", "with caching", "legacy endpoint",
    "regional mirror", "sandbox", "read-only", "beta", "async", "extended", "lite", "pro",
]
REAL_EMBED_MAX = 2000  # above this, synthetic vectors


def base_docs() -> list[ToolDoc]:
    docs: list[ToolDoc] = []
    for ds in ("toollens", "mcptoolbenchpp"):
        d, _ = load_catalog(benchdata_dir() / ds / "catalog.jsonl")
        docs.extend(d)
    return docs


def bench_queries(n: int, seed: int = 1) -> list[str]:
    texts: list[str] = []
    for ds in ("toollens", "mcptoolbenchpp"):
        _, key_of = load_catalog(benchdata_dir() / ds / "catalog.jsonl")
        texts.extend(q.text for q in load_queries(benchdata_dir() / ds / "queries.jsonl", key_of))
    uniq = sorted(set(texts))
    random.Random(seed).shuffle(uniq)
    return uniq[:n]


def synthetic_catalog(size: int, seed: int = 7) -> tuple[list[ToolDoc], list[int]]:
    """`size` docs varied from the dev catalogs, and for each the index of its base doc."""
    base = base_docs()
    rng = random.Random(seed)
    docs: list[ToolDoc] = []
    origin: list[int] = []
    for i in range(size):
        b = i % len(base)
        j = i // len(base)
        d = base[b]
        if j == 0:
            docs.append(d)
        else:
            variant = rng.choice(_VARIANTS)
            server = f"{d.server}-{j}"
            tool = f"{d.tool}_{variant.split()[0]}{j}"
            docs.append(
                ToolDoc(
                    name=f"{d.name[:40]}_{j}_{i}",
                    server=server,
                    tool=tool,
                    description=f"{d.description} ({variant}, variant {j})",
                    input_schema=d.input_schema,
                )
            )
        origin.append(b)
    return docs, origin


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return round(s[min(len(s) - 1, max(0, int(np.ceil(q / 100 * len(s))) - 1))] * 1000, 3)


def _stats(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "p50_ms": _pct(samples, 50), "p95_ms": _pct(samples, 95), "max_ms": _pct(samples, 100)}


def measure(
    sizes: tuple[int, ...] = (500, 2000, 20000, 100000),
    n_queries: int = 300,
    top_k: int = 5,
    mode: str = "hybrid",
    embedder: str = "onnx",
    reuse: dict[str, Any] | None = None,
    real_max: int = REAL_EMBED_MAX,
) -> dict[str, Any]:
    """Search latency per catalog size: cache misses (distinct queries), hits, narrow scope.

    `reuse` holds per-size results of an earlier run (from its progress log) to keep.
    """
    queries = bench_queries(n_queries)
    base = base_docs()
    out: dict[str, Any] = {"top_k": top_k, "mode": mode, "queries": len(queries), "sizes": {}}
    base_vecs: np.ndarray | None = None
    for size in sizes:
        if reuse and str(size) in reuse:
            out["sizes"][str(size)] = {**reuse[str(size)], "from_progress_log": True}
            continue
        docs, origin = synthetic_catalog(size)
        eng = Engine(state_dir=None, mode=mode, embedder=embedder, cache_size=4096, cache_ttl=3600)
        eng.load()
        synthetic = size > real_max
        t0 = time.perf_counter()
        if synthetic:
            if base_vecs is None:
                base_vecs = eng._embedder.embed([make_text(d) for d in base])  # noqa: SLF001
            rng = np.random.default_rng(size)
            vecs = base_vecs[np.asarray(origin)] + rng.normal(0, 0.02, (size, base_vecs.shape[1])).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            eng.seed_embeddings(docs, vecs)
        eng.update(docs, [])
        index_s = time.perf_counter() - t0
        miss: list[float] = []
        for q in queries:
            t = time.perf_counter()
            res = eng.search(q, top_k)
            miss.append(time.perf_counter() - t)
            assert not res.cached and len(res.hits) == top_k
        hit: list[float] = []
        for q in queries:
            t = time.perf_counter()
            res = eng.search(q, top_k)
            hit.append(time.perf_counter() - t)
            assert res.cached
        servers = sorted({d.server for d in docs})
        rng2 = random.Random(size)
        narrow: list[float] = []
        for q in queries[:100]:
            scope = [rng2.choice(servers)]
            t = time.perf_counter()
            eng.search(q + " ", top_k, servers=scope)
            narrow.append(time.perf_counter() - t)
        # the same distinct queries with the query-vector cache warm: ranking cost alone
        eng._cache.clear()  # noqa: SLF001
        rank_only: list[float] = []
        for q in queries:
            t = time.perf_counter()
            eng.search(q, top_k)
            rank_only.append(time.perf_counter() - t)
        out["sizes"][str(size)] = {
            "tools": len(eng),
            "servers": len(servers),
            "vectors": "synthetic (base embedding + noise)" if synthetic else "real",
            "index_s": round(index_s, 2),
            "miss": _stats(miss),
            "hit": _stats(hit),
            "narrow_scope_miss": _stats(narrow),
            "ranking_only": _stats(rank_only),
        }
        print(f"size {size}: {json.dumps(out['sizes'][str(size)])}", file=sys.stderr, flush=True)
        del eng
    return out


def make_text(doc: ToolDoc) -> str:
    from toolatlas.retrieval.engine import make_entry

    return make_entry(doc).text


def _link_models(state: Path) -> None:
    from toolatlas.retrieval.embed import ensure_onnx_export, models_dir

    ensure_onnx_export(None)
    state.mkdir(parents=True, exist_ok=True)
    (state / "models").symlink_to(models_dir(None), target_is_directory=True)


def _vm_rss_mb() -> tuple[float, float]:
    rss = hwm = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    return round(rss / 1024, 1), round(hwm / 1024, 1)


def _child(phase: str, state: Path, size: int, embedder: str) -> dict[str, Any]:
    """One fresh process: "cold" indexes `size` tools into an empty state_dir; "restart"
    starts on the state the cold phase left and re-lists the same catalog."""
    docs, _ = synthetic_catalog(size)
    queries = bench_queries(50)
    t0 = time.perf_counter()
    eng = Engine(state_dir=state, embedder=embedder)
    eng.load()
    t_load = time.perf_counter() - t0
    out: dict[str, Any] = {"phase": phase, "tools": size, "embedder_load_s": round(t_load, 3)}
    if phase == "restart":
        first = eng.search(queries[0], 5)
        out["time_to_first_search_s"] = round(time.perf_counter() - t0, 3)
        out["first_search_served_from_snapshot"] = bool(first.hits)
    eng.update(docs, [])
    out["index_s" if phase == "cold" else "relist_done_s"] = round(time.perf_counter() - t0, 3)
    for q in queries:
        eng.search(q, 5)
    st = eng.stats()
    out["embeddings_computed"] = st["embeddings_computed"]
    out["snapshot_restored"] = st["snapshot_restored"]
    out["rss_mb"], out["peak_rss_mb"] = _vm_rss_mb()
    out["torch_imported"] = "torch" in sys.modules
    return out


def _run_child(phase: str, state: Path, size: int, embedder: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", phase, "--state", str(state),
         "--child-size", str(size), "--embedder", embedder],
        capture_output=True, text=True, timeout=3600, env={**os.environ, "PYTHONPATH": str(REPO / "daemon")},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{phase} child failed: {proc.stderr[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_cold_and_restart(size: int = 2000, embedder: str = "onnx") -> dict[str, Any]:
    """Cold indexing of `size` tools into a fresh state_dir (fresh process), then a restart
    (another fresh process) on it; each reports its resident memory with the tools indexed.

    The ONNX export (a one-time ~15 s step per machine) is linked in, not counted.
    """
    tmp = Path(tempfile.mkdtemp(prefix="toolatlas-bench-"))
    try:
        state = tmp / "state"
        _link_models(state)
        cold = _run_child("cold", state, size, embedder)
        restart = _run_child("restart", state, size, embedder)
        return {"tools": size, "cold": cold, "restart": restart}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(int(s) for s in result["sizes"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, style in (("miss", "-"), ("hit", ":"), ("narrow_scope_miss", "--")):
        for pct, marker in (("p50_ms", "o"), ("p95_ms", "s")):
            ys = [result["sizes"][str(s)][kind][pct] for s in sizes]
            ax.plot(sizes, ys, style, marker=marker, label=f"{kind} {pct[:3]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("catalog size (tools)")
    ax.set_ylabel("Engine.search latency (ms)")
    ax.set_title(f"toolatlas Engine.search, {result['mode']}, top_k={result['top_k']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _progress_log(path: Path) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        if line.startswith("size ") and ": " in line:
            head, _, body = line.partition(": ")
            got[head.split()[1]] = json.loads(body)
    return got


def _write(result: dict[str, Any], stem: str = "search_latency") -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    plot(result["search"], OUT / f"{stem}.png")
    result["plot"] = str(OUT / f"{stem}.png")
    (OUT / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="500,2000,20000,100000")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--embedder", default="onnx")
    p.add_argument("--quick", action="store_true", help="sizes 500,2000 and 100 queries")
    p.add_argument("--skip-cold", action="store_true")
    p.add_argument("--real-max", type=int, default=REAL_EMBED_MAX, help="largest size embedded for real")
    p.add_argument("--out-name", default="search_latency", help="file stem under bench/out")
    p.add_argument("--reuse-log", type=Path, help="keep per-size results from an earlier run's stderr")
    p.add_argument("--child", choices=["cold", "restart"], help=argparse.SUPPRESS)
    p.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child-size", type=int, default=2000, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.state, args.child_size, args.embedder)))
        return 0
    sizes = (500, 2000) if args.quick else tuple(int(s) for s in args.sizes.split(","))
    nq = 100 if args.quick else args.queries
    reuse = _progress_log(args.reuse_log) if args.reuse_log else None
    result: dict[str, Any] = {"machine_cores": os.cpu_count(), "loadavg_start": os.getloadavg()}
    result["search"] = measure(sizes, nq, embedder=args.embedder, reuse=reuse, real_max=args.real_max)
    result["loadavg_after_search"] = os.getloadavg()
    _write(result, args.out_name)
    if not args.skip_cold:
        result["cold_and_restart"] = measure_cold_and_restart(2000, args.embedder)
        result["loadavg_end"] = os.getloadavg()
        _write(result, args.out_name)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
