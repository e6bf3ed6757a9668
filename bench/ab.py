"""A/B of two trees of toolatlas in one run, interleaved call by call, so the machine's noise
(other jobs, frequency changes, a CPU hog) falls on both sides alike and the ratio means
something on a loaded 2-core host.

    .venv/bin/python bench/ab.py --before REV [--calls 400] [--queries 300] [--sizes 500,2000]
        [--hit-passes 1] [--gap-ms G] [--hit-gap-ms G] [--skip-calls] [--skip-search]

`--before REV` is checked out once into a detached git worktree under /tmp; "after" is this
tree. Each side runs its own `toolatlas serve` (the side's code through PYTHONPATH) on the
same generated config, and its own shim; the upstreams (the project's test server, the
synthetic catalog upstream) and the clients are this tree's, the same for both.

* calls (what `bench/call_overhead.py` measures): one warm direct SDK session to the test
  server, and an SDK session through each side's socket and each side's shim; each round
  makes one `echo` call on every path, in a shuffled order.
* search (what `bench/search_latency.py --skip-engine --skip-cold` measures): per size, both
  daemons index the same synthetic catalog (real ONNX embeddings); each query is sent to A
  and B back to back, in alternating order: cache misses (distinct queries), then the same
  queries again (result-cache hits). `--gap-ms G` pauses G ms before every miss.
  Without it each daemon's query starts right after the other's, and the query embedder's
  spinning rule (retrieval/hostload.py: other processes' CPU over the last >= 0.25 s) counts
  the other daemon's query as load and embeds on one thread, where a lone daemon (what
  `search_latency.py` runs) spins two; a pause longer than that window lets each side see
  the host as a lone daemon does. Trees from before the rule always spin, so without the
  pause the miss ratio against them measures the rule, not the code. A pause only after each
  pair made the side asked first after it the slower by ~3x (bench/README.md, stop 36); before
  every miss, both sides start each query from the same idle machine. `--hit-gap-ms G`
  pauses G ms before every hit too: back to back, the side asked second answers while the
  other is still at work after its reply (its event line, metrics, the client's read), and
  on two cores that cost lands on whichever is asked second (the halves below, one per
  order, disagreed by 0.19-0.46 at stop 51); after a pause each hit is timed as a lone
  daemon's, as `search_latency.py` times it.

Prints JSON (also bench/out/ab.json): every side's median and p95, and after/before ratios
of those figures. A ratio's noise is estimated by splitting the samples into two halves
(odd and even rounds) and reporting both halves' ratios too (`halves`): a difference that
the halves disagree on is noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from _common import REPO, Daemon, emit, interleaved, pct_ms, proc_cpu_s, stdio_testserver, wait_settled
from tests.support.servers import testserver_args
from toolatlas.surface.rawclient import RawClient
from toolatlas.surface.unix import unix_client

SETTLE_S = 180.0


def checkout(rev: str) -> Path:
    """A detached worktree of `rev` (made once, reused)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"toolatlas-ab-{sha[:12]}"
    if not (tree / "daemon" / "toolatlas").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(tree), sha],
                       check=True, capture_output=True)
    return tree


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def side_env(tree: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{tree / 'daemon'}{os.pathsep}{REPO}"}


def figures(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "median_ms": pct_ms(samples, 50), "p95_ms": pct_ms(samples, 95)}


def ratios(before: list[float], after: list[float]) -> dict[str, Any]:
    """after/before of the median and p95, over all samples and over each half."""
    def r(b: list[float], a: list[float]) -> dict[str, float]:
        return {"median": round(pct_ms(a, 50) / pct_ms(b, 50), 3), "p95": round(pct_ms(a, 95) / pct_ms(b, 95), 3)}

    return {**r(before, after), "halves": [r(before[0::2], after[0::2]), r(before[1::2], after[1::2])]}


async def _calls(n: int, sockets: dict[str, str], envs: dict[str, dict[str, str]], pids: dict[str, int]) -> dict[str, Any]:
    upstream = StdioServerParameters(command=sys.executable, args=testserver_args())
    via = {"name": "bench__echo", "arguments": {"message": "hi"}}
    async with Client(upstream) as direct, Client(unix_client(sockets["before"])) as sock_b, \
            Client(unix_client(sockets["after"])) as sock_a, \
            Client(StdioServerParameters(command=sys.executable, args=["-m", "toolatlas", "shim", "--socket", sockets["before"]],
                                         env=dict(os.environ, **envs["before"]))) as shim_b, \
            Client(StdioServerParameters(command=sys.executable, args=["-m", "toolatlas", "shim", "--socket", sockets["after"]],
                                         env=dict(os.environ, **envs["after"]))) as shim_a:
        paths: dict[str, tuple[Client, str, dict[str, Any]]] = {
            "direct": (direct, "echo", {"message": "hi"}),
            "socket_before": (sock_b, "execute_tool", via), "socket_after": (sock_a, "execute_tool", via),
            "shim_before": (shim_b, "execute_tool", via), "shim_after": (shim_a, "execute_tool", via),
        }
        cpu0 = {side: proc_cpu_s(pid) for side, pid in pids.items()}
        times = await interleaved(paths, n, warmup=20)
        cpu = {side: proc_cpu_s(pid) - cpu0[side] for side, pid in pids.items()}
    d = times["direct"]
    out: dict[str, Any] = {k: figures(v) for k, v in times.items()}
    # Each daemon's own CPU (user + system, /proc clock ticks) per call it served: socket and
    # shim calls alike, the 20 warm-up rounds included. What the gateway costs, not what it waits.
    per_call = {side: round(c / (2 * (n + 20)) * 1000, 3) for side, c in cpu.items()}
    out["daemon_cpu_ms_per_call"] = {**per_call, "ratio": round(per_call["after"] / per_call["before"], 3)
                                     if per_call.get("before") else None}
    for path in ("socket", "shim"):
        b, a = times[f"{path}_before"], times[f"{path}_after"]
        over_b = [x - y for x, y in zip(b, d)]
        over_a = [x - y for x, y in zip(a, d)]
        out[f"{path}_ratio"] = ratios(b, a)
        out[f"{path}_overhead_ms"] = {"before": pct_ms(over_b, 50), "after": pct_ms(over_a, 50)}
        out[f"{path}_overhead_ratio"] = ratios(over_b, over_a)
    return out


def bench_calls(tmp: Path, trees: dict[str, Path], n: int) -> dict[str, Any]:
    daemons = {side: Daemon(mkdir(tmp / f"calls-{side}"), stdio_testserver("bench")) for side in trees}
    envs = {side: side_env(tree) for side, tree in trees.items()}
    try:
        for side, d in daemons.items():
            d.start(env=envs[side], wait_ready=120)
        pids = {s: d.proc.pid for s, d in daemons.items() if d.proc is not None}
        return anyio.run(_calls, n, {s: d.socket for s, d in daemons.items()}, envs, pids)
    finally:
        for d in daemons.values():
            d.__exit__(None, None, None)


def bench_search(tmp: Path, trees: dict[str, Path], size: int, queries: list[str], hit_passes: int = 1,
                 gap_s: float = 0.0, hit_gap_s: float = 0.0) -> dict[str, Any]:
    from catalog_upstream import upstream_block

    block = upstream_block("cat00", size, 0, 1, "relist_interval = 0\n")
    daemons = {side: Daemon(mkdir(tmp / f"search-{size}-{side}"), block, search_extra='embedder = "onnx"\n')
               for side in trees}
    try:
        for side, d in daemons.items():
            d.start(env=side_env(trees[side]), wait_ready=3600)
        for d in daemons.values():
            d.wait_for(lambda d=d: d.status()["index"]["tools"] >= size, timeout=3600, what=f"{size} tools indexed")
            wait_settled(d.status, SETTLE_S)
        times: dict[str, list[float]] = {f"{kind}_{side}": [] for kind in ("miss", "hit") for side in trees}
        clients = {side: RawClient(d.socket, timeout=60) for side, d in daemons.items()}
        try:
            for kind, passes in (("miss", 1), ("hit", hit_passes)):
                for i, q in enumerate(queries * passes):
                    for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
                        if gap_s and kind == "miss":
                            time.sleep(gap_s)  # before every miss: each side starts from the same idle
                        elif hit_gap_s and kind == "hit":
                            time.sleep(hit_gap_s)  # the other side's work after its reply is done
                        t0 = time.perf_counter()
                        r = clients[side].call_tool("tool_search", {"query": q, "top_k": 5})
                        times[f"{kind}_{side}"].append(time.perf_counter() - t0)
                        assert len((r.get("structuredContent") or {}).get("matches") or []) == 5, r
        finally:
            for c in clients.values():
                c.close()
        out: dict[str, Any] = {k: figures(v) for k, v in times.items()}
        for kind in ("miss", "hit"):
            out[f"{kind}_ratio"] = ratios(times[f"{kind}_before"], times[f"{kind}_after"])
        return out
    finally:
        for d in daemons.values():
            d.__exit__(None, None, None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git revision of the 'before' side")
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--hit-passes", type=int, default=1, help="ask the cached queries this many times (more hit samples)")
    p.add_argument("--sizes", default="500,2000")
    p.add_argument("--gap-ms", type=float, default=0.0,
                   help="pause before every miss (> 250 ms: each daemon sees a host as quiet as a lone daemon's)")
    p.add_argument("--hit-gap-ms", type=float, default=0.0,
                   help="pause before every hit (the other daemon's work after its reply is done by then)")
    p.add_argument("--skip-calls", action="store_true")
    p.add_argument("--skip-search", action="store_true")
    a = p.parse_args()
    trees = {"before": checkout(a.before), "after": REPO}
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "daemon"], capture_output=True, text=True).stdout.strip())
    out: dict[str, Any] = {"bench": "ab", "before": a.before, "after": head + ("+dirty" if dirty else ""),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "gap_ms": a.gap_ms, "hit_gap_ms": a.hit_gap_ms, "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]}
    tmp = Path(tempfile.mkdtemp(prefix="toolatlas-ab-"))
    try:
        if not a.skip_calls:
            out["calls"] = bench_calls(tmp, trees, a.calls)
            print(f"calls: {json.dumps(out['calls'])}", file=sys.stderr, flush=True)
        if not a.skip_search:
            from search_latency import bench_queries

            queries = bench_queries(a.queries)
            out["search"] = {}
            for size in a.sizes.split(","):
                out["search"][size] = bench_search(tmp, trees, int(size), queries, a.hit_passes,
                                                     a.gap_ms / 1000, a.hit_gap_ms / 1000)
                print(f"search {size}: {json.dumps(out['search'][size])}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    emit(out, "ab")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
