"""Where a cache-hit tool_search's time goes in two trees: daemon CPU and py-spy per hit.

    .venv/bin/python bench/hit_profile.py --before TREE [--after .] [--hits 8000] [--py-spy PATH]
        [--catalog-tools N]

For each tree (a checkout; its `daemon/` goes first on the daemon's PYTHONPATH) a daemon with
two stdio test servers (BM25) answers the same tool_search `--hits` times on one stdlib-client
connection after 200 warm-up hits. With `--catalog-tools N` the upstream is instead
`catalog_upstream.py`'s N-tool synthetic catalog (what `ab.py` and `search_latency.py` search)
with the ONNX embedder, the daemon waits for all N indexed and settled (`wait_settled`: Rift's
analysis and the rest of the background work, up to 180 s as in `ab.py`), and the hits cycle
through four queries after 50 warm-up hits of each. Reported per hit: wall ms, the daemon's
CPU ms (/proc), and when py-spy is found (`--py-spy`, else on PATH) the GIL-holding samples at 1 kHz by
function (inclusive), with the functions whose share changed most between the trees. The
trees run one after the other: compare CPU and samples, which load moves less than wall time.
Prints JSON.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO, Daemon, emit, proc_cpu_s, stdio_testserver, wait_settled
from toolatlas.surface.rawclient import RawClient

ARGS = {"query": "echo the message back", "top_k": 5}


def _functions(raw: Path) -> collections.Counter[str]:
    """Inclusive samples by function name from py-spy's raw (collapsed stacks) output."""
    out: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        for name in {frame.split(" (")[0] for frame in stack.split(";")}:
            out[name] += int(n)
    return out


SETTLE_S = 180.0  # as ab.py: trees from before Rift named its index never read as settled
CATALOG_QUERIES = ["read a file from disk", "send an email to a colleague", "search the web for news",
                   "create a calendar event"]


def profile(tree: Path, hits: int, spy: str | None, catalog_tools: int = 0,
            ) -> tuple[dict[str, Any], collections.Counter[str]]:
    tmp = Path(tempfile.mkdtemp(prefix="toolatlas-hits-"))
    queries = [ARGS] if not catalog_tools else [{"query": q, "top_k": 5} for q in CATALOG_QUERIES]
    try:
        if catalog_tools:
            from catalog_upstream import upstream_block

            d = Daemon(tmp, upstream_block("cat00", catalog_tools, 0, 1, "relist_interval = 0\n"),
                       search_extra='embedder = "onnx"\n')
        else:
            d = Daemon(tmp, stdio_testserver("alpha") + stdio_testserver("beta"))
        with d.start(env={"PYTHONPATH": str(tree / "daemon")}, wait_ready=600):
            assert d.proc is not None
            pid = d.proc.pid
            if catalog_tools:
                d.wait_for(lambda: d.status()["index"]["tools"] >= catalog_tools, timeout=600, what="indexed")
                wait_settled(d.status, SETTLE_S)
            with RawClient(d.socket, timeout=60) as c:
                for args in queries:
                    for _ in range(200 // len(queries)):
                        c.call_tool("tool_search", args)
                raw = tmp / "spy.raw"
                rec = None if spy is None else subprocess.Popen(
                    [spy, "record", "-p", str(pid), "-r", "1000", "-f", "raw", "-o", str(raw), "--gil"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0 if rec is not None else 0)
                load = os.getloadavg()[0]
                c0, t0 = proc_cpu_s(pid), time.perf_counter()
                for i in range(hits):
                    c.call_tool("tool_search", queries[i % len(queries)])
                wall, cpu = time.perf_counter() - t0, proc_cpu_s(pid) - c0
                if rec is not None:
                    rec.send_signal(2)
                    rec.wait(60)
            funcs = _functions(raw) if rec is not None and raw.exists() else collections.Counter()
        row = {"tree": str(tree), "load_1m": round(load, 2), "wall_ms_per_hit": round(wall / hits * 1000, 4),
               "daemon_cpu_ms_per_hit": round(cpu / hits * 1000, 4)}
        if funcs:
            row["gil_ms_per_hit"] = round(max(funcs.values()) / hits, 4)
        return row, funcs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, type=Path)
    p.add_argument("--after", type=Path, default=REPO)
    p.add_argument("--hits", type=int, default=8000)
    p.add_argument("--py-spy", default=shutil.which("py-spy"))
    p.add_argument("--top", type=int, default=0, help="also list each tree's N costliest functions")
    p.add_argument("--catalog-tools", type=int, default=0, help="search a synthetic N-tool catalog (ONNX) instead")
    a = p.parse_args()
    before, fb = profile(a.before.resolve(), a.hits, a.py_spy, a.catalog_tools)
    after, fa = profile(a.after.resolve(), a.hits, a.py_spy, a.catalog_tools)
    out: dict[str, Any] = {"bench": "hit_profile", "hits": a.hits, "catalog_tools": a.catalog_tools,
                           "before": before, "after": after}
    if fb and fa:
        names = set(fb) | set(fa)
        moved = sorted(names, key=lambda k: abs(fa[k] - fb[k]), reverse=True)[:25]
        out["largest_changes_us_per_hit"] = [
            {"function": k, "before": round(fb[k] / a.hits * 1000, 2), "after": round(fa[k] / a.hits * 1000, 2)}
            for k in moved]
    for label, funcs in (("before", fb), ("after", fa)):
        if a.top and funcs:
            out[f"top_us_per_hit_{label}"] = {k: round(v / a.hits * 1000, 2) for k, v in funcs.most_common(a.top)}
    emit(out, "hit_profile")


if __name__ == "__main__":
    main()
