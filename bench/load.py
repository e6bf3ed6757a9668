"""Load: N concurrent clients through the daemon's Unix socket, mixed workload, bounded time.

    python bench/load.py [--clients 1,10,100] [--duration 60] [--think 1.0] [--search-share 0.7]
                         [--tools 500] [--final-duration 0]

One real daemon (`toolatlas serve` through the test harness: hybrid ranker, ONNX embedder)
federates two stdio upstreams: `catalog` (the ToolLens + MCPToolBench++ benchdata catalog,
served by bench/catalog_upstream.py, `--tools` tools) and `fast` (the project's test
server; execute_tool calls its `echo`).

Clients: one thread per client, each holding one persistent connection with the stdlib
`RawClient` (toolatlas.surface.rawclient). Threads + blocking sockets scale to 100 clients on
2 cores with far less client-side CPU than 100 SDK `Client` sessions (pydantic validation of
every message), which would compete with the daemon for the same two cores. Each client runs
a closed loop: pick an operation (`tool_search` with probability `--search-share`, else
`execute_tool fast__echo`), wait for the answer, then think for an exponentially distributed
time with mean `--think` seconds (agents think between tool calls; with zero think time any
N saturates the daemon and latency only measures the queue). Search queries are distinct
texts from ../shared/benchdata/toollens/queries-train.jsonl, shuffled and shared by all
clients (no query repeats until the 16,893 are used up, so the query cache does not flatter
the figures).

Per level: throughput (operations/s), latency p50/p95/p99/max per operation, errors (an
exception, a JSON-RPC error or an isError result; each kind counted with a sample), daemon
VmRSS and open fds sampled at start (all clients connected), middle and end, plus every
5 s. `--final-duration S` adds one more level at the largest N for S seconds (the 5-minute
acceptance run: `--final-duration 300`). Acceptance (issue 6): at 100 clients zero errors,
no RSS/fd growth over the run, p99 search <= 4x its value at 1 client.

Prints JSON; a copy goes to bench/out/load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, Daemon, emit, pct_ms, proc_mem_mb, stdio_testserver  # noqa: E402
from catalog_upstream import upstream_block  # noqa: E402

from toolatlas.surface.rawclient import RawClient  # noqa: E402

QUERIES = REPO / ".." / "shared" / "benchdata" / "toollens" / "queries-train.jsonl"
SAMPLE_EVERY_S = 5.0
RSS_GROWTH_LIMIT = 0.10  # "no growth": end within 10 % of start (allocator noise, warm caches)


def proc_sample(pid: int) -> dict[str, float]:
    return {"t": round(time.monotonic(), 2), "rss_mb": proc_mem_mb(pid)["VmRSS"], "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def lat(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    ms = [x * 1000 for x in xs]
    return {"n": len(ms), "p50_ms": pct_ms(xs, 50, 2), "p95_ms": pct_ms(xs, 95, 2),
            "p99_ms": pct_ms(xs, 99, 2), "max_ms": round(max(ms), 2), "mean_ms": round(statistics.fmean(ms), 2)}


class QueryPool:
    def __init__(self, path: Path, seed: int = 11) -> None:
        seen: set[str] = set()
        self.queries: list[str] = []
        for line in path.read_text().splitlines():
            if line.strip():
                q = json.loads(line)["query"]
                if q not in seen:
                    seen.add(q)
                    self.queries.append(q)
        random.Random(seed).shuffle(self.queries)
        self.i = 0
        self.lock = threading.Lock()
        self.wrapped = 0

    def next(self) -> str:
        with self.lock:
            q = self.queries[self.i]
            self.i += 1
            if self.i == len(self.queries):
                self.i = 0
                self.wrapped += 1
            return q


class Level:
    def __init__(self, sock: str, n: int, duration: float, think: float, search_share: float, queries: QueryPool) -> None:
        self.sock, self.n, self.duration, self.think, self.search_share = sock, n, duration, think, search_share
        self.queries = queries
        self.lat: dict[str, list[float]] = {"search": [], "execute": []}
        self.errors: dict[str, int] = {}
        self.error_samples: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.connected = threading.Barrier(n + 1)

    def error(self, kind: str, detail: str) -> None:
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1
            if len(self.error_samples) < 10:
                self.error_samples.append(f"{kind}: {detail[:300]}")

    def client(self, idx: int) -> None:
        rng = random.Random(1000 + idx)
        try:
            c = RawClient(self.sock, timeout=60)
        except Exception as exc:  # noqa: BLE001 - counted, never hidden
            self.error("connect", repr(exc))
            self.connected.wait()
            return
        self.connected.wait()
        try:
            # Spread the first requests over one think time so the clients do not start in step.
            if self.stop.wait(rng.random() * self.think):
                return
            while not self.stop.is_set():
                search = rng.random() < self.search_share
                t0 = time.perf_counter()
                try:
                    if search:
                        r = c.call_tool("tool_search", {"query": self.queries.next(), "top_k": 5})
                    else:
                        r = c.call_tool("execute_tool", {"name": "fast__echo", "arguments": {"message": f"c{idx}"}})
                    dt = time.perf_counter() - t0
                    if r.get("isError"):
                        self.error("search_isError" if search else "execute_isError", json.dumps(r)[:300])
                    elif search and not r["structuredContent"]["matches"]:
                        self.error("search_empty", json.dumps(r)[:300])
                    elif not search and r["content"][0]["text"] != f"Echo: c{idx}":
                        self.error("execute_wrong", json.dumps(r)[:300])
                    else:
                        with self.lock:
                            self.lat["search" if search else "execute"].append(dt)
                except Exception as exc:  # noqa: BLE001
                    self.error(type(exc).__name__, repr(exc))
                    try:
                        c.close()
                        c = RawClient(self.sock, timeout=60)
                    except Exception as exc2:  # noqa: BLE001
                        self.error("reconnect", repr(exc2))
                        return
                if self.think > 0 and self.stop.wait(rng.expovariate(1.0 / self.think)):
                    break
        finally:
            c.close()

    def run(self, pid: int) -> dict[str, Any]:
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(self.n)]
        for t in threads:
            t.start()
        self.connected.wait(timeout=120)
        t_start = time.monotonic()
        samples = [proc_sample(pid)]
        marks = {"start": samples[0]}
        while True:
            left = t_start + self.duration - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(SAMPLE_EVERY_S, left))
            s = proc_sample(pid)
            samples.append(s)
            if "middle" not in marks and s["t"] - t_start >= self.duration / 2:
                marks["middle"] = s
        marks["end"] = samples[-1]
        elapsed = time.monotonic() - t_start
        self.stop.set()
        for t in threads:
            t.join(timeout=120)
        ops = len(self.lat["search"]) + len(self.lat["execute"])
        rss_growth = (marks["end"]["rss_mb"] - marks["start"]["rss_mb"]) / max(1.0, marks["start"]["rss_mb"])
        return {
            "clients": self.n,
            "duration_s": round(elapsed, 1),
            "ops": ops,
            "throughput_ops_s": round(ops / elapsed, 2),
            "latency": {"search": lat(self.lat["search"]), "execute": lat(self.lat["execute"])},
            "errors": sum(self.errors.values()),
            "errors_by_kind": self.errors,
            "error_samples": self.error_samples,
            "daemon": {
                "start": marks["start"], "middle": marks.get("middle", marks["end"]), "end": marks["end"],
                "rss_mb_min_max": [min(s["rss_mb"] for s in samples), max(s["rss_mb"] for s in samples)],
                "fds_min_max": [min(s["fds"] for s in samples), max(s["fds"] for s in samples)],
                "rss_growth_pct": round(rss_growth * 100, 1),
                "fd_growth": marks["end"]["fds"] - marks["start"]["fds"],
                "series_s_rss_fds": [[round(x["t"] - t_start, 1), x["rss_mb"], x["fds"]] for x in samples],
            },
            "loadavg": os.getloadavg(),
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="1,10,100", help="comma-separated client counts")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per level")
    p.add_argument("--final-duration", type=float, default=0.0,
                   help="an extra run at the largest client count for this many seconds (300 = acceptance)")
    p.add_argument("--think", type=float, default=1.0, help="mean think time between a client's operations (s)")
    p.add_argument("--search-share", type=float, default=0.7, help="fraction of operations that are tool_search")
    p.add_argument("--tools", type=int, default=500, help="tools in the catalog upstream")
    p.add_argument("--embedder", default="onnx", help="search embedder (onnx | none)")
    p.add_argument("--cache-size", type=int, default=None, help="[search] cache_size (default: the daemon's)")
    p.add_argument("--query-threads", type=int, default=None, help="[search] query_threads (default: the daemon's)")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.clients.split(",") if x]
    queries = QueryPool(QUERIES.resolve())
    upstreams = upstream_block("catalog", args.tools) + stdio_testserver("fast")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="toolatlas-load-") as tmp_s:
        extra = f'embedder = "{args.embedder}"\n' + (f"cache_size = {args.cache_size}\n" if args.cache_size is not None else "")
        extra += f"query_threads = {args.query_threads}\n" if args.query_threads is not None else ""
        d = Daemon(Path(tmp_s), upstreams, search_extra=extra)
        with d:
            d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 120, "upstreams ready")
            d.wait_for(lambda: d.status()["index"].get("tools", 0) >= args.tools, 300, "catalog indexed")
            assert d.proc is not None
            pid = d.proc.pid
            idle_before = proc_sample(pid)
            plan = [(n, args.duration) for n in levels]
            if args.final_duration > 0:
                plan.append((max(levels), args.final_duration))
            for n, duration in plan:
                res = Level(d.socket, n, duration, args.think, args.search_share, queries).run(pid)
                # Once the clients are gone: the daemon must close their connections (poll up to 10 s).
                settle = time.monotonic() + 10
                while proc_sample(pid)["fds"] > idle_before["fds"] + 2 and time.monotonic() < settle:
                    time.sleep(0.2)
                res["daemon"]["idle_after"] = proc_sample(pid)
                results.append(res)
                print(f"# {n} clients, {duration:g} s: {res['throughput_ops_s']} ops/s, search p99 "
                      f"{res['latency']['search'].get('p99_ms')} ms, errors {res['errors']}", file=sys.stderr, flush=True)
            status = d.status()
    by_n: dict[int, dict[str, Any]] = {}
    for r in results:
        by_n.setdefault(r["clients"], r)  # the first (60 s) level of each N
    one, top = by_n.get(1), results[-1]
    ratio = None
    if one and one["latency"]["search"].get("p99_ms") and top["latency"]["search"].get("p99_ms"):
        ratio = round(top["latency"]["search"]["p99_ms"] / one["latency"]["search"]["p99_ms"], 2)
    acceptance = {
        "run": f"{top['clients']} clients, {top['duration_s']} s",
        "p99_search_ratio_vs_1_client": ratio,
        "p99_ratio_ok": ratio is not None and ratio <= 4,
        "zero_errors": top["errors"] == 0,
        "no_fd_growth": top["daemon"]["fd_growth"] <= 0,
        "no_rss_growth": top["daemon"]["rss_growth_pct"] <= RSS_GROWTH_LIMIT * 100,
    }
    out = {
        "command": "python bench/load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "client": "stdlib RawClient, one thread and one persistent connection per client",
        "workload": {"search_share": args.search_share, "think_mean_s": args.think, "catalog_tools": args.tools,
                     "embedder": args.embedder, "cache_size": args.cache_size, "query_threads": args.query_threads, "queries": "toollens queries-train.jsonl, distinct, shuffled",
                     "queries_wrapped": queries.wrapped},
        "daemon_idle_before": idle_before,
        "levels": results,
        "acceptance": acceptance,
        "index": {k: status["index"].get(k) for k in ("tools", "mode", "embedder", "cache")},
        "cpus": os.cpu_count(),
    }
    emit(out, "load")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
