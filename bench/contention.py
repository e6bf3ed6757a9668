"""tool_search miss latency with and without a one-core CPU hog beside the daemon, in one run.

    .venv/bin/python bench/contention.py [--tools 2000] [--rounds 8] [--queries 120] [--query-threads N]

One daemon (hybrid, ONNX, the 2,000-tool replicated benchdata catalog over stdio, result
cache off) is timed through its Unix socket with the stdlib client. Rounds alternate: "quiet"
(nothing added) and "hog" (`python -c 'while 1: pass'` started half a second before the
round and killed after it), the order flipped every round. Every query of the run is a
distinct real dev-set query (ToolLens + MCPToolBench++, 2,553 of them), so each is a miss of
the result cache and of the query-vector cache: the daemon embeds each query. Reports per
round p50/p95 and the ratio of the median p95s (issue 19's "tool_search miss p95 with a
one-core CPU hog beside it / without, same run", target <= 1.6). `--query-threads` sets
`[search] query_threads` (default: the daemon's). Prints JSON.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Daemon, emit, median, pct_ms, wait_settled
from catalog_upstream import upstream_block
from search_latency import RIFT_WAIT_S, bench_queries
from toolatlas.surface.rawclient import RawClient

HOG = [sys.executable, "-c", "while 1: pass"]


def run(tools: int, rounds: int, per_round: int, query_threads: int | None) -> dict[str, Any]:
    queries = bench_queries(100_000)
    need = rounds * 2 * per_round
    if need > len(queries):
        raise SystemExit(f"{rounds} rounds x 2 x {per_round} queries = {need}: only {len(queries)} distinct "
                         "queries exist (lower --rounds or --queries)")
    extra = 'embedder = "onnx"\ncache_size = 0\n' + (f"query_threads = {query_threads}\n" if query_threads else "")
    tmp = Path(tempfile.mkdtemp(prefix="toolatlas-contention-"))
    try:
        with Daemon(tmp, upstream_block("cat00", tools, 0, 1, "relist_interval = 0\n"), search_extra=extra) as d:
            d.wait_for(lambda: (idx := d.status()["index"])["tools"] >= tools and idx["degraded"] is None,
                       timeout=3600, what=f"{tools} tools indexed")
            settled, _ = wait_settled(d.status, RIFT_WAIT_S)
            samples: dict[str, list[list[float]]] = {"quiet": [], "hog": []}
            loads: list[float] = []
            with RawClient(d.socket, timeout=60) as c:
                for q in queries[:20]:  # warm-up (these queries are not reused)
                    c.call_tool("tool_search", {"query": q, "top_k": 5})
                cursor = 20
                for r in range(rounds):
                    for state in (("quiet", "hog") if r % 2 == 0 else ("hog", "quiet")):
                        hog = subprocess.Popen(HOG) if state == "hog" else None
                        try:
                            if hog is not None:
                                time.sleep(0.5)
                            loads.append(os.getloadavg()[0])
                            took = []
                            for q in queries[cursor:cursor + per_round]:
                                t0 = time.perf_counter()
                                res = c.call_tool("tool_search", {"query": q, "top_k": 5})
                                took.append(time.perf_counter() - t0)
                                if res.get("isError") or not (res.get("structuredContent") or {}).get("matches"):
                                    raise RuntimeError(f"tool_search failed: {res}")
                            cursor += per_round
                            samples[state].append(took)
                        finally:
                            if hog is not None:
                                hog.kill()
                                hog.wait()
            idx = d.status()["index"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    p95 = {k: [pct_ms(r, 95) for r in v] for k, v in samples.items()}
    p50 = {k: [pct_ms(r, 50) for r in v] for k, v in samples.items()}
    ratios = [round(h / q, 3) for q, h in zip(p95["quiet"], p95["hog"])]
    return {
        "bench": "contention",
        "tools": idx["tools"],
        "query_embedder": idx.get("query_embedder"),
        "query_threads": query_threads or "default",
        "rounds": rounds,
        "queries_per_round": per_round,
        "settled_before_timing": settled,
        "load_1m_at_rounds": [round(x, 2) for x in loads],
        "p50_ms_per_round": p50,
        "p95_ms_per_round": p95,
        "median_p95_ms": {k: median(v) for k, v in p95.items()},
        "median_p50_ms": {k: median(v) for k, v in p50.items()},
        "hog_over_quiet_p95": round(median(p95["hog"]) / median(p95["quiet"]), 3),
        "per_round_ratio": ratios,
        "goal": "hog_over_quiet_p95 <= 1.6",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tools", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--queries", type=int, default=120, help="queries per round and state")
    p.add_argument("--query-threads", type=int, default=None)
    a = p.parse_args()
    emit(run(a.tools, a.rounds, a.queries, a.query_threads), "contention")


if __name__ == "__main__":
    main()
