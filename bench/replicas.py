"""Replicas sharing state in PostgreSQL (issue 21): what a second replica saves, what the store
costs a search, and how fast a change made through one replica reaches another.

    .venv/bin/python bench/replicas.py [--tools 2000] [--queries 300] [--rounds 20]

A throwaway PostgreSQL (tests/support/postgres.py) and real `toolatlas serve` processes, each
federating its own stdio `catalog_upstream.py` (the benchdata catalog replicated to N tools:
the same texts, so the same embedding keys), hybrid ranker, ONNX embedder (the export linked
in, as every bench does; no model export is timed):

* `cold_start`: spawn to hybrid search over every tool (`index.model.phase` "ready"), on an
  empty state_dir: `alone` without `[store]`, `first_with_store` (an empty store: it embeds
  and publishes), `second_with_store` (the store holds every vector: it embeds none;
  `embeddings_computed` is reported). Goal: second <= 10 % of alone.
* `search`: tool_search over the Unix socket, distinct ToolLens queries (cache misses), sent
  to the daemon without a store and to one with it, alternating query by query so both see
  the same machine load; p50/p95 each and the ratio. Goal: within 5 %.
* `propagation`: two replicas on one streamable-HTTP test server; a tool added silently to it
  and re-listed through replica A, timed until replica B's tool_search lists it (polled every
  10 ms): median and p95 over `--rounds`. And the port itself (ports.Shared, what feedback and
  approvals use): an event appended through one in-process Replica until another's subscriber
  has it. Goal: within 2 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Daemon, emit, median, pct_ms, start_server, wait_settled
from catalog_upstream import upstream_block
from startup import bench_queries, try_status

from tests.support.postgres import PgServer


def store_block(url: str) -> str:
    return f'[store]\nurl = "{url}"\ncatchup_interval = 1\nretry_interval = 0.5\n'


def cold_start(tmp: Path, name: str, n: int, extra: str, timeout: float = 900.0) -> tuple[Daemon, dict[str, Any]]:
    """A daemon on an empty state_dir, timed from spawn to hybrid search over `n` tools; left running."""
    (tmp / name).mkdir()
    d = Daemon(tmp / name, extra + upstream_block("big", n, extra="relist_interval = 0\n"),
               search_extra='embedder = "onnx"\n')
    t0 = time.perf_counter()
    d.start(wait_ready=timeout, ready=False)
    deadline = t0 + timeout
    while True:
        st = try_status(d.socket)
        idx = (st or {}).get("index") or {}
        if idx.get("model", {}).get("phase") == "ready" and idx.get("tools", 0) >= n:
            break
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{name}: not hybrid within {timeout} s: {idx}")
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    return d, {"hybrid_s": round(seconds, 3), "tools": idx["tools"], "embeddings_computed": idx["embeddings_computed"],
               "embeddings_shared": idx.get("embeddings_shared"), "model_load_s": idx.get("timings", {}).get("embedder_load_s")}


def search_ab(alone: Daemon, shared: Daemon, queries: list[str]) -> dict[str, Any]:
    from toolatlas.surface.rawclient import RawClient

    samples: dict[str, list[float]] = {"without_store": [], "with_store": []}
    with RawClient(alone.socket, timeout=60) as ca, RawClient(shared.socket, timeout=60) as cb:
        for i, q in enumerate(queries):
            order = [("without_store", ca), ("with_store", cb)]
            for key, c in order if i % 2 == 0 else reversed(order):
                t = time.perf_counter()
                r = c.call_tool("tool_search", {"query": q, "top_k": 5})
                samples[key].append(time.perf_counter() - t)
                assert not r.get("isError"), r
    out: dict[str, Any] = {k: {"n": len(v), "p50_ms": pct_ms(v, 50), "p95_ms": pct_ms(v, 95)} for k, v in samples.items()}
    out["p95_ratio"] = round(out["with_store"]["p95_ms"] / out["without_store"]["p95_ms"], 3)
    out["p50_ratio"] = round(out["with_store"]["p50_ms"] / out["without_store"]["p50_ms"], 3)
    return out


def propagation(tmp: Path, url: str, rounds: int) -> dict[str, Any]:
    srv = start_server("testserver", "http", log=tmp / "http-testserver.log")
    try:
        up = store_block(url) + f'[[upstream]]\nname = "shared"\ntransport = "http"\nurl = "{srv.url}"\nrelist_interval = 0\n'
        delays: list[float] = []
        for name in ("pa", "pb"):
            (tmp / name).mkdir()
        with Daemon(tmp / "pa", up) as a, Daemon(tmp / "pb", up) as b:
            for i in range(rounds):
                tool = f"fresh_{i}"
                out = a.tool("execute_tool", {"name": "shared__add_tool", "arguments": {
                    "name": tool, "description": f"Replica propagation probe {i}.", "announce": False}})
                assert not out.get("isError"), out
                t0 = time.perf_counter()
                with a.client() as c:
                    c.request("toolatlas/upstream/relist", {"name": "shared"})
                while f"shared__{tool}" not in {m["name"] for m in b.meta("tool_search", {
                        "query": f"replica propagation probe {i}", "top_k": 3})["matches"]}:
                    if time.perf_counter() - t0 > 30:
                        raise TimeoutError(f"{tool} did not reach B within 30 s")
                    time.sleep(0.01)
                delays.append(time.perf_counter() - t0)
        catalog = {"rounds": len(delays), "median_ms": round(median(delays) * 1000, 1), "p95_ms": pct_ms(delays, 95, 1),
                   "max_ms": pct_ms(delays, 100, 1),
                   "measures": "relist through A returned .. B's tool_search lists the new tool (includes A's relist)"}
    finally:
        srv.kill()
    return {"catalog_change": catalog, "port_event": port_delays(tmp, url, rounds * 5)}


def port_delays(tmp: Path, url: str, n: int) -> dict[str, Any]:
    import anyio

    from toolatlas.config import StoreSection
    from toolatlas.store.ports import Change
    from toolatlas.store.replica import Replica

    async def main() -> list[float]:
        cfg = StoreSection(url=url, catchup_interval=1.0)
        a, b = Replica(cfg, str(tmp / "port-a")), Replica(cfg, str(tmp / "port-b"))
        got: dict[str, float] = {}

        async def heard(change: Change) -> None:
            got[change.key] = time.perf_counter()

        b.subscribe("feedback", heard)
        sent: dict[str, float] = {}
        async with anyio.create_task_group() as tg:
            await tg.start(a.run)
            await tg.start(b.run)
            for i in range(n):
                sent[f"k{i}"] = time.perf_counter()
                await a.append("feedback", f"k{i}", {"i": i})
                with anyio.fail_after(30):
                    while f"k{i}" not in got:
                        await anyio.sleep(0.001)
            tg.cancel_scope.cancel()
        return [got[k] - sent[k] for k in sent]

    xs = anyio.run(main)
    return {"events": len(xs), "median_ms": round(median(xs) * 1000, 1), "p95_ms": pct_ms(xs, 95, 1),
            "measures": "Replica.append on A (fsync to its buffer included) .. B's subscriber called"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tools", type=int, default=2000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    pg = PgServer()
    result: dict[str, Any] = {"tools": args.tools, "loadavg_before": os.getloadavg(), "nproc": os.cpu_count()}
    try:
        url = pg.new_database()
        with tempfile.TemporaryDirectory(prefix="ta-replicas-") as tmp_s:
            tmp = Path(tmp_s)
            alone, result_alone = cold_start(tmp, "alone", args.tools, "")
            daemons = [alone]
            try:
                # Each start is timed on an otherwise quiet toolatlas: the one before has finished
                # its after-start work (Rift, token counts, snapshot) first.
                result_alone["settled_before_next"] = wait_settled(lambda: try_status(alone.socket), 900)[0]
                first, result_first = cold_start(tmp, "first", args.tools, store_block(url))
                daemons.append(first)
                deadline = time.monotonic() + 120
                while (s := (try_status(first.socket) or {}).get("store", {})).get("vectors_pending", 1) or \
                        s.get("vectors_stored", 0) < result_first["embeddings_computed"]:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"first replica's vectors not stored: {s}")
                    time.sleep(0.1)
                first.stop()
                second, result_second = cold_start(tmp, "second", args.tools, store_block(url))
                daemons.append(second)
                result["cold_start"] = {
                    "alone": result_alone, "first_with_store": result_first, "second_with_store": result_second,
                    "second_over_alone": round(result_second["hybrid_s"] / result_alone["hybrid_s"], 3),
                }
                result_second["settled_before_search"] = wait_settled(lambda: try_status(second.socket), 900)[0]
                result["search"] = search_ab(alone, second, bench_queries(args.queries))
            finally:
                for d in daemons:
                    if d.proc is not None and d.proc.poll() is None:
                        d.stop()
            result["propagation"] = propagation(tmp, url, args.rounds)
    finally:
        pg.close()
    result["loadavg_after"] = os.getloadavg()
    emit(result, "replicas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
