"""tool_search latency against catalog size, end to end through the daemon's Unix socket;
the engine's share of it; cold indexing, restart and resident memory.

    python bench/search_latency.py [--sizes 500,2000,20000,100000] [--queries 300] [--quick]
                                   [--skip-engine] [--skip-cold]

Prints one JSON object (also written to bench/out/search_latency.json) and plots p50/p95
against catalog size into bench/out/search_latency.png.

* socket (the acceptance figures): for each size a real `toolatlas serve` (default hybrid
  ranker, default ONNX embedder) federates synthetic stdio upstreams, `bench/catalog_upstream.py`:
  the dev catalogs (ToolLens + MCPToolBench++, 513 tools) replicated with varied names and
  descriptions, in shards of at most 5,000 tools (a daemon caps one upstream at 20,000), so
  100,000 tools are 20 upstreams. Up to 2,000 tools the daemon embeds every document itself.
  Embedding 20k-100k texts takes too long on 2 cores, so for those sizes the daemon's
  embedding cache in state_dir is seeded before it starts: each document's vector is its base
  tool's real embedding plus Gaussian noise, renormalised (cosine to the base ~0.9), and the
  daemon's `embeddings_computed` must stay 0; the JSON says which sizes are synthetic. The
  upstreams do not re-list (relist_interval = 0: their catalogs never change).
  Timed with the stdlib client (`toolatlas.surface.rawclient`) on one connection, once the
  daemon's background Rift analysis and token accounting have finished: "miss" = distinct real queries (toollens
  test + mcptoolbenchpp), each a result-cache and query-vector miss, the query embedded by the
  daemon; "hit" = the same queries again (result-cache hits); "narrow_scope_miss" (when there
  are 2+ upstreams) = `servers` = one upstream, query vectors cached. `daemon_cpu_ms_per_miss`:
  the daemon's CPU (user + system, every thread, /proc) over the misses, per miss.
* engine: the same catalogs and queries through `Engine.search` in this process (miss, hit,
  narrow scope over one of many servers, ranking only with query vectors cached): where the
  time goes, without the socket and the daemon.
* `measure_cold_and_restart()` indexes 2,000 tools into a fresh state_dir, then restarts a
  new Engine on it: time to first search and embeddings computed (must be 0); each phase
  runs in a fresh process and reports its VmRSS with the tools indexed.
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
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from toolatlas.evaluation.datasets import benchdata_dir, load_catalog, load_queries  # noqa: E402
from toolatlas.retrieval.engine import Engine, ToolDoc  # noqa: E402
from _common import pct_ms, proc_cpu_s, proc_mem_mb, wait_settled  # noqa: E402

SHARD_TOOLS = 5000  # tools per synthetic upstream in the socket bench
RIFT_WAIT_S = 120  # at most this long for the daemon's background work (Rift, tokens, snapshot) before timing

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


def _stats(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "p50_ms": pct_ms(samples, 50), "p95_ms": pct_ms(samples, 95), "max_ms": pct_ms(samples, 100)}


def measure(
    sizes: tuple[int, ...] = (500, 2000, 20000, 100000),
    n_queries: int = 300,
    top_k: int = 5,
    mode: str = "hybrid",
    embedder: str = "onnx",
    real_max: int = REAL_EMBED_MAX,
) -> dict[str, Any]:
    """Engine.search latency per catalog size, in process: cache misses (distinct queries),
    hits, narrow scope, ranking only."""
    queries = bench_queries(n_queries)
    base = base_docs()
    out: dict[str, Any] = {"top_k": top_k, "mode": mode, "queries": len(queries), "sizes": {}}
    base_vecs: np.ndarray | None = None
    for size in sizes:
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
        print(f"engine size {size}: {json.dumps(out['sizes'][str(size)])}", file=sys.stderr, flush=True)
        del eng
    return out


def _seed_daemon_embeddings(index_dir: Path, tools: list[dict[str, Any]], servers: list[str], size: int) -> int:
    """Write the daemon's embedding cache for `tools` as served by `servers` (synthetic
    vectors: the base tool's real fp32 embedding plus noise). Returns the vectors written."""
    from catalog_upstream import shard, tool_docs
    from toolatlas.retrieval import persist
    from toolatlas.retrieval.embed import get_embedder
    from toolatlas.retrieval.documents import doc_key, doc_text

    emb = get_embedder("onnx", index_dir)
    n_base = max(t["base"] for t in tools) + 1
    base_vecs = emb.embed([doc_text(d) for d in tool_docs(tools[:n_base], servers[0])])
    rng = np.random.default_rng(size)
    vec_of: dict[bytes, np.ndarray] = {}
    for k, server in enumerate(servers):
        part = shard(tools, k, len(servers))
        vecs = base_vecs[np.asarray([t["base"] for t in part])]
        vecs = vecs + rng.normal(0, 0.02, vecs.shape).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        for doc, vec in zip(tool_docs(part, server), vecs):
            vec_of[doc_key(doc)] = vec
    persist.save_embeddings(index_dir, emb.name, vec_of)
    return len(vec_of)


def _socket_size(size: int, queries: list[str], top_k: int, real_max: int) -> dict[str, Any]:
    """One daemon federating `size` synthetic tools; tool_search timed over its socket."""
    from catalog_upstream import catalog_tools, upstream_block
    from tests.support.daemon import Daemon
    from toolatlas.surface.rawclient import RawClient

    tools = catalog_tools(size)
    shards = max(1, -(-size // SHARD_TOOLS))
    servers = [f"cat{k:02d}" for k in range(shards)]
    synthetic = size > real_max
    tmp = Path(tempfile.mkdtemp(prefix="toolatlas-bench-sock-"))
    try:
        # The synthetic catalogs never change: no periodic re-listing of up to 100k tools.
        upstreams = "".join(upstream_block(srv, size, k, shards, "relist_interval = 0\n") for k, srv in enumerate(servers))
        d = Daemon(tmp, upstreams, search_extra='embedder = "onnx"\n')
        seeded = _seed_daemon_embeddings(tmp / "state" / "index", tools, servers, size) if synthetic else 0
        t0 = time.perf_counter()
        d.start(wait_ready=3600)
        try:
            # Indexed = every tool embedded too: BM25 serves them earlier, while the model loads.
            d.wait_for(lambda: (idx := d.status()["index"])["tools"] >= size and idx["degraded"] is None,
                       timeout=3600, what=f"{size} tools indexed")
            index_s = time.perf_counter() - t0
            # Steady state: the daemon's background work after a catalog change (the Rift
            # analysis, the token accounting, the snapshot write) has finished before timing.
            settled, st = wait_settled(d.status, RIFT_WAIT_S)
            rift: dict[str, Any] = st.get("rift") or {}
            timed: dict[str, list[float]] = {"miss": [], "hit": [], "narrow_scope_miss": []}
            with RawClient(d.socket, timeout=60) as c:
                def run(kind: str, qs: list[str], **extra: Any) -> None:
                    for i, q in enumerate(qs):
                        args: dict[str, Any] = {"query": q, "top_k": top_k}
                        if extra.get("narrow"):
                            args["servers"] = [servers[i % shards]]
                        t = time.perf_counter()
                        r = c.call_tool("tool_search", args)
                        timed[kind].append(time.perf_counter() - t)
                        matches = (r.get("structuredContent") or {}).get("matches") or []
                        assert not r.get("isError") and len(matches) == top_k, r
                        assert not extra.get("narrow") or {m["server"] for m in matches} == {servers[i % shards]}

                cpu0 = proc_cpu_s(d.proc.pid)
                run("miss", queries)
                miss_cpu_ms = (proc_cpu_s(d.proc.pid) - cpu0) * 1000 / len(queries)
                run("hit", queries)
                if shards > 1:
                    # a result-cache miss (distinct scope), query vector cached: ranking inside one upstream
                    run("narrow_scope_miss", queries[:100], narrow=True)
            st = d.status()
            rss = proc_mem_mb(d.proc.pid)["VmRSS"]
        finally:
            d.__exit__(None, None, None)
        idx = st["index"]
        row: dict[str, Any] = {
            "tools": idx["tools"],
            "upstreams": shards,
            "vectors": f"synthetic (base embedding + noise; {seeded} seeded)" if synthetic else "real",
            "embedder": idx.get("embedder"),
            "query_embedder": idx.get("query_embedder"),
            "embeddings_computed": idx.get("embeddings_computed"),
            "start_to_indexed_s": round(index_s, 1),
            "rift": {k: rift.get(k) for k in ("available", "reason") if k in rift},
            "settled_before_timing": settled,
            "daemon_rss_mb": rss,
            **{k: _stats(v) for k, v in timed.items() if v},
            "daemon_cpu_ms_per_miss": round(miss_cpu_ms, 2),
        }
        if synthetic and row["embeddings_computed"]:
            raise RuntimeError(f"size {size}: the daemon embedded {row['embeddings_computed']} documents; "
                               "the seeded cache does not match its documents")
        return row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure_socket(sizes: tuple[int, ...], n_queries: int = 300, top_k: int = 5,
                   real_max: int = REAL_EMBED_MAX) -> dict[str, Any]:
    """tool_search end to end through the Unix socket, per catalog size (see module doc)."""
    queries = bench_queries(n_queries)
    out: dict[str, Any] = {"top_k": top_k, "mode": "hybrid", "queries": len(queries),
                           "client": "toolatlas.surface.rawclient, one Unix-socket connection", "sizes": {}}
    for size in sizes:
        out["sizes"][str(size)] = _socket_size(size, queries, top_k, real_max)
        print(f"socket size {size}: {json.dumps(out['sizes'][str(size)])}", file=sys.stderr, flush=True)
    return out


def make_text(doc: ToolDoc) -> str:
    from toolatlas.retrieval.documents import doc_text

    return doc_text(doc)


def _link_models(state: Path) -> None:
    from toolatlas.retrieval.embed import ensure_onnx_export, models_dir

    ensure_onnx_export(None)
    state.mkdir(parents=True, exist_ok=True)
    (state / "models").symlink_to(models_dir(None), target_is_directory=True)


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
    mem = proc_mem_mb(os.getpid())
    out["rss_mb"], out["peak_rss_mb"] = mem["VmRSS"], mem["VmHWM"]
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

    fig, ax = plt.subplots(figsize=(8, 4.8))
    series = []
    if "socket" in result:
        series += [("socket", "miss", "-"), ("socket", "hit", "-")]
    if "engine" in result:
        series += [("engine", "miss", "--")]
    for section, kind, style in series:
        sizes = sorted(int(x) for x in result[section]["sizes"])
        for pct, marker in (("p50_ms", "o"), ("p95_ms", "s")):
            ys = [result[section]["sizes"][str(x)][kind][pct] for x in sizes]
            ax.plot(sizes, ys, style, marker=marker, label=f"{section} {kind} {pct[:3]}")
    for y, label in ((15, "goal: miss p95 at 2k"), (30, "goal: miss p95 at 100k"), (2, "goal: hit p95")):
        ax.axhline(y, color="grey", lw=0.8, ls=":")
        ax.text(450, y * 1.05, label, fontsize=7, color="grey")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("catalog size (tools)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("toolatlas tool_search: through the Unix socket (socket) and Engine.search in-process (engine)",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(result: dict[str, Any], stem: str = "search_latency") -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    plot(result, OUT / f"{stem}.png")
    result["plot"] = str(OUT / f"{stem}.png")
    (OUT / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")


def goals(result: dict[str, Any]) -> dict[str, bool]:
    """Issue 3's latency goals, on the socket figures."""
    sock = result.get("socket", {}).get("sizes", {})
    out: dict[str, bool] = {}
    if "2000" in sock:
        out["socket miss p95 <= 15 ms at 2,000 tools"] = sock["2000"]["miss"]["p95_ms"] <= 15
    if "100000" in sock:
        out["socket miss p95 <= 30 ms at 100,000 tools"] = sock["100000"]["miss"]["p95_ms"] <= 30
    if sock:
        out["socket hit p95 <= 2 ms at every size"] = all(r["hit"]["p95_ms"] <= 2 for r in sock.values())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="500,2000,20000,100000")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--embedder", default="onnx", help="for the engine and cold/restart sections")
    p.add_argument("--quick", action="store_true", help="sizes 500,2000 and 100 queries")
    p.add_argument("--skip-engine", action="store_true", help="no in-process Engine.search section")
    p.add_argument("--skip-cold", action="store_true", help="no cold-indexing / restart section")
    p.add_argument("--real-max", type=int, default=REAL_EMBED_MAX, help="largest size embedded for real")
    p.add_argument("--out-name", default="search_latency", help="file stem under bench/out")
    p.add_argument("--child", choices=["cold", "restart"], help=argparse.SUPPRESS)
    p.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child-size", type=int, default=2000, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.state, args.child_size, args.embedder)))
        return 0
    sizes = (500, 2000) if args.quick else tuple(int(s) for s in args.sizes.split(","))
    nq = 100 if args.quick else args.queries
    result: dict[str, Any] = {"machine_cores": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    result["socket"] = measure_socket(sizes, nq, real_max=args.real_max)
    result["loadavg_after_socket"] = [round(x, 2) for x in os.getloadavg()]
    result["goals"] = goals(result)
    _write(result, args.out_name)
    if not args.skip_engine:
        result["engine"] = measure(sizes, nq, embedder=args.embedder, real_max=args.real_max)
        result["loadavg_after_engine"] = [round(x, 2) for x in os.getloadavg()]
        _write(result, args.out_name)
    if not args.skip_cold:
        result["cold_and_restart"] = measure_cold_and_restart(2000, args.embedder)
        result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        _write(result, args.out_name)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
