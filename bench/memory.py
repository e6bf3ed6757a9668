"""Daemon resident memory with N tools indexed, and where it goes (issue 19 item 3).

    .venv/bin/python bench/memory.py --tools 2000 [--restarts 1] [--trace 0]
    .venv/bin/python bench/memory.py --tools 100000

A real `toolatlas serve` (default hybrid ranker, ONNX embedder; the shared ONNX export linked
in) federates `bench/catalog_upstream.py` in shards of 5,000 tools. Up to 2,000 tools the
daemon embeds every document itself (the cold start), then is restarted on the same
state_dir (`--restarts`, warm: zero embeddings). Above 2,000 its embedding cache is seeded
first as bench/search_latency.py does (each vector its base tool's real embedding plus
noise; `embeddings_computed` must stay 0), since embedding 100,000 texts on two cores takes
far longer than the bench should; the JSON says so.

Each start waits until every tool is in the hybrid index and the daemon's background work
(Rift, token counts, snapshot) has settled, runs 50 distinct ToolLens test queries, then
reads VmRSS / VmHWM from /proc and asks the probe (bench/memprobe/sitecustomize.py, put on
the daemon's PYTHONPATH) for smaps_rollup, resident MB per mapping, pymalloc's statistics
and, with `--trace N`, tracemalloc's top allocation sites (slow: diagnostics only).
Prints JSON and writes bench/out/memory-<tools>.json.

Another tree's daemon: `PYTHONPATH=/path/to/tree/daemon .venv/bin/python bench/memory.py ...`
(the caller's PYTHONPATH goes before this tree's `daemon/` on the daemon's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import OUT, REPO, caller_pythonpath, memprobe_report, proc_mem_mb, wait_settled
from catalog_upstream import catalog_tools, upstream_block

PROBE = Path(__file__).resolve().parent / "memprobe"
SHARD_TOOLS = 5000
REAL_EMBED_MAX = 2000


def one_start(d: Any, n: int, tag: str, trace: int, timeout: float) -> dict[str, Any]:
    from startup import bench_queries

    probe_out = d.tmp / f"probe-{tag}.json"
    # the caller's PYTHONPATH before this tree's daemon/: `PYTHONPATH=/other/tree/daemon` measures that tree's code
    env = {"PYTHONPATH": os.pathsep.join([str(PROBE), *caller_pythonpath(), str(REPO / "daemon")]),
           "TOOLATLAS_MEMPROBE_OUT": str(probe_out)}
    if trace:
        env["TOOLATLAS_MEMPROBE_TRACE"] = str(trace)
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:  # the daemon's largest VmRSS seen (VmHWM counts the same, but only at the end)
        while not done.wait(0.5):
            try:
                peak[0] = max(peak[0], proc_mem_mb(d.proc.pid)["VmRSS"])
            except (OSError, KeyError, AttributeError):
                pass

    t0 = time.monotonic()
    d.start(wait_ready=timeout, env=env)
    threading.Thread(target=sample, daemon=True).start()
    try:
        d.wait_for(lambda: (i := d.status()["index"])["tools"] >= n and i["degraded"] is None, timeout=timeout,
                   what=f"{n} tools in the hybrid index")
        indexed_s = time.monotonic() - t0
        settled, st = wait_settled(d.status, timeout)
        lat = []
        for q in bench_queries(50):
            t = time.perf_counter()
            d.search(q)
            lat.append(time.perf_counter() - t)
        mem = proc_mem_mb(d.proc.pid)
        probe = memprobe_report(d, probe_out)
        idx = d.status()["index"]
    finally:
        done.set()
        d.stop(timeout=120)
    lat.sort()
    rollup = {ln.split(":")[0]: round(int(ln.split()[1]) / 1024, 1) for ln in str(probe.get("smaps_rollup", "")).splitlines()[1:]
              if ln.split(":")[0] in ("Rss", "Anonymous", "Pss_File", "Private_Clean", "Shared_Clean")}
    return {
        "start": tag, "start_to_indexed_s": round(indexed_s, 1), "settled": settled,
        "rift": {k: (st.get("rift") or {}).get(k) for k in ("available", "reason")},
        "embeddings_computed": idx.get("embeddings_computed"), "VmRSS_mb": mem["VmRSS"], "VmHWM_mb": mem["VmHWM"],
        "sampled_peak_rss_mb": peak[0], "search_p50_ms": round(lat[len(lat) // 2] * 1000, 1),
        "smaps_rollup_mb": rollup, "rss_after_trim_mb": probe.get("rss_after_trim_only_mb"),
        "rss_after_gc_trim_mb": probe.get("rss_after_trim_mb"),
        "torch_imported": probe.get("torch_imported"), "maps_mb": probe.get("maps_mb"), "pymalloc": probe.get("pymalloc"),
        **({"traced_mb": probe.get("traced_mb"), "traced_by_site_mb": probe.get("traced_by_toolatlas_site_mb")} if trace else {}),
    }


def run(n: int, restarts: int, trace: int, timeout: float) -> dict[str, Any]:
    from search_latency import _seed_daemon_embeddings
    from tests.support.daemon import Daemon

    shards = max(1, -(-n // SHARD_TOOLS))
    servers = [f"cat{k:02d}" for k in range(shards)] if shards > 1 else ["catalog"]
    extra = "relist_interval = 0\n" if shards > 1 else ""
    res: dict[str, Any] = {"bench": "memory", "tools": n, "upstreams": shards, "machine_cores": os.cpu_count(),
                           "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="toolatlas-memory-") as tmp_s:
        tmp = Path(tmp_s)
        d = Daemon(tmp, "".join(upstream_block(s, n, k, shards, extra) for k, s in enumerate(servers)),
                   search_extra='embedder = "onnx"\n')
        starts = []
        if n > REAL_EMBED_MAX:
            res["vectors"] = "synthetic, seeded into the embedding cache before the first start (base embedding + noise)"
            res["seeded"] = _seed_daemon_embeddings(tmp / "state" / "index", catalog_tools(n), servers, n)
        else:
            res["vectors"] = "real: the first start embeds every tool"
            starts.append(one_start(d, n, "cold", 0, timeout))
        for i in range(restarts):
            starts.append(one_start(d, n, f"warm{i}" if n <= REAL_EMBED_MAX else f"seeded{i}", trace, timeout))
        res["starts"] = starts
    res["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tools", type=int, default=2000)
    p.add_argument("--restarts", type=int, default=1)
    p.add_argument("--trace", type=int, default=0, help="tracemalloc frames in the last start (0: off)")
    p.add_argument("--timeout", type=float, default=3600)
    a = p.parse_args()
    res = run(a.tools, a.restarts, a.trace, a.timeout)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"memory-{a.tools}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
