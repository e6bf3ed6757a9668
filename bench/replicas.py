"""Replicas sharing state in PostgreSQL (issue 21): what a second replica saves, what the store
costs a search, and how fast a change made through one replica reaches another.

    .venv/bin/python bench/replicas.py [--tools 2000] [--queries 200] [--search-rounds 8] [--rounds 20]
        [--profile] [--only cold,search,propagation]

A throwaway PostgreSQL (tests/support/postgres.py) and real `toolatlas serve` processes, each
federating its own stdio `catalog_upstream.py` (the benchdata catalog replicated to N tools:
the same texts, so the same embedding keys), hybrid ranker, ONNX embedder (the export linked
in, as every bench does; no model export is timed):

* `cold_start`: spawn to hybrid search over every tool (`index.model.phase` "ready"), on an
  empty state_dir: `alone` without `[store]`, `first_with_store` (an empty store: it embeds
  and publishes), `second_with_store` (the store holds every vector: it embeds none;
  `embeddings_computed` is reported). Goal: second <= 10 % of alone.
* `search`: tool_search over the Unix socket, distinct ToolLens queries (cache misses: no
  query is sent twice to a daemon), to a daemon without a store and one with it, alternating
  query by query (the order flipping each query and each round) so both see the same machine
  load. The two are twins: warm restarts from two copies (X, Y) of one settled state_dir (the
  same index snapshot and HNSW graph), the store configured on X for the first half of the
  rounds and on Y for the second (both restarted between), so what differs between two
  processes falls on both sides. `--search-rounds` rounds of `--queries` queries: a p95 per
  daemon per round (with the 1-minute load average at the round's start); the figures are
  the ratio of the medians of those p95s (with / without) and the median of the per-round
  ratios (each round's two p95s saw the same load). Goal: within 5 %. With `--profile` the
  with-store daemon of the second half runs the stack sampler (bench/_sampler) during one
  more round of searches sent to it alone: how many of its active stacks were in
  toolatlas/store code, and how many of those inside a search.
* `propagation`: two replicas on one streamable-HTTP test server (BM25 ranker, learning on),
  each measured over `--rounds` rounds, median, p95 and max. Goal: within 2 s.
  - `catalog_change`: a tool added silently to the server and re-listed through replica A,
    timed until replica B's tool_search lists it (polled every 10 ms; includes A's re-list).
  - `feedback`: a tool_search on A and an execute_tool of its third result on the same
    connection (a usage event on A), timed from the call's answer until B's published learned
    state holds the event (`learning.events` in B's catalog_status, polled every 10 ms: from
    then on B's ranking uses it) and, separately, until B's tool_search for that query ranks
    the tool above where it was. Rounds back to back (`feedback`: B's learning publishes at
    most every 0.5 s, and it published for the round before moments ago) and 1 s apart
    (`feedback_spaced`).
  - `approval`: with `require_approval`, `toolatlas upstream reject` then `approve` through A,
    each timed from the request until B's tool_search stops / starts serving the upstream.
  - `port_event`: an event appended through one in-process Replica until another's
    subscriber has it (the port under feedback and approvals).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Daemon, caller_pythonpath, emit, median, pct_ms, start_server, wait_settled
from catalog_upstream import upstream_block
from startup import bench_queries, try_status

from tests.support.postgres import PgServer


def store_block(url: str) -> str:
    return f'[store]\nurl = "{url}"\ncatchup_interval = 1\nretry_interval = 0.5\n'


SAMPLER = Path(__file__).resolve().parent / "_sampler"


def cold_start(tmp: Path, name: str, n: int, extra: str, timeout: float = 900.0,
               env: dict[str, str] | None = None) -> tuple[Daemon, dict[str, Any]]:
    """A daemon on an empty state_dir, timed from spawn to hybrid search over `n` tools; left running."""
    (tmp / name).mkdir()
    d = Daemon(tmp / name, extra + upstream_block("big", n, extra="relist_interval = 0\n"),
               search_extra='embedder = "onnx"\n')
    t0, t0_wall = time.perf_counter(), time.time()
    d.start(wait_ready=timeout, ready=False, env=env)
    deadline = t0 + timeout
    seen: dict[str, float] = {}  # when each (index ready, model phase) was first polled, seconds from spawn
    while True:
        st = try_status(d.socket)
        idx = (st or {}).get("index") or {}
        if idx:
            seen.setdefault(f"{'ready' if idx.get('ready') else 'starting'}/{idx.get('model', {}).get('phase')}",
                            round(time.perf_counter() - t0, 3))
        if idx.get("model", {}).get("phase") == "ready" and idx.get("tools", 0) >= n:
            break
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{name}: not hybrid within {timeout} s: {idx}")
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    return d, {"hybrid_s": round(seconds, 3), "tools": idx["tools"], "embeddings_computed": idx["embeddings_computed"],
               "embeddings_shared": idx.get("embeddings_shared"), "model_load_s": idx.get("timings", {}).get("embedder_load_s"),
               "first_polled": seen, "timings": idx.get("timings"), "log": log_marks(d.log, t0_wall)}


LOG_MARKS = {"listening on": "socket listening", "store.connected": "store connected",
             "retrieval.model_loaded": "model loaded", "tools, protocol": "upstream listed",
             "catalog of big changed": "first index (BM25)", "index ready:": "index ready",
             "retrieval.hybrid_ready": "hybrid ready"}


def log_marks(log: Path, t0_wall: float) -> dict[str, float]:
    """Seconds from spawn to the first log line of each LOG_MARKS step (the daemon's log
    clock, millisecond stamps): the start's timeline."""
    import datetime

    out: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        for needle, step in LOG_MARKS.items():
            if needle in line and step not in out:
                try:
                    at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                except ValueError:
                    continue
                out[step] = round(at - t0_wall, 3)
    return out


def search_ab(alone: Daemon, shared: Daemon, queries: list[str], rounds: int) -> dict[str, Any]:
    """`rounds` rounds over consecutive slices of `queries` (each sent once to each daemon),
    alternating daemons query by query; see the module docstring."""
    from toolatlas.surface.rawclient import RawClient

    per_round = len(queries) // rounds
    rows: list[dict[str, Any]] = []
    every: dict[str, list[float]] = {"without_store": [], "with_store": []}
    with RawClient(alone.socket, timeout=60) as ca, RawClient(shared.socket, timeout=60) as cb:
        for r in range(rounds):
            load = os.getloadavg()[0]
            samples: dict[str, list[float]] = {"without_store": [], "with_store": []}
            for i, q in enumerate(queries[r * per_round:(r + 1) * per_round]):
                order = [("without_store", ca), ("with_store", cb)]
                for key, c in order if (i + r) % 2 == 0 else reversed(order):
                    t = time.perf_counter()
                    res = c.call_tool("tool_search", {"query": q, "top_k": 5})
                    samples[key].append(time.perf_counter() - t)
                    assert not res.get("isError"), res
            for k, v in samples.items():
                every[k] += v
            without, with_ = pct_ms(samples["without_store"], 95), pct_ms(samples["with_store"], 95)
            rows.append({"load_1m": round(load, 2), "p95_without_ms": without, "p95_with_ms": with_,
                         "p50_without_ms": pct_ms(samples["without_store"], 50),
                         "p50_with_ms": pct_ms(samples["with_store"], 50), "ratio": round(with_ / without, 3)})
    med_without = median([r["p95_without_ms"] for r in rows])
    med_with = median([r["p95_with_ms"] for r in rows])
    return {
        "rounds": rounds, "queries_per_round": per_round, "per_round": rows,
        "median_p95_without_ms": med_without, "median_p95_with_ms": med_with,
        "ratio_of_median_p95": round(med_with / med_without, 3),
        "median_round_ratio": median([r["ratio"] for r in rows]),
        "rounds_with_store_faster": sum(r["ratio"] < 1 for r in rows),
        "load_1m_min_max": [min(r["load_1m"] for r in rows), max(r["load_1m"] for r in rows)],
        "all_samples": {k: {"n": len(v), "p50_ms": pct_ms(v, 50), "p95_ms": pct_ms(v, 95)} for k, v in every.items()},
    }


def profile_searches(shared: Daemon, out: Path, queries: list[str]) -> dict[str, Any]:
    """The sampler's view of the with-store daemon while it answers `queries` (and nothing else)."""
    from toolatlas.surface.rawclient import RawClient

    flag = Path(str(out) + ".on")
    flag.touch()
    try:
        with RawClient(shared.socket, timeout=60) as c:
            for q in queries:
                assert not c.call_tool("tool_search", {"query": q, "top_k": 5}).get("isError")
    finally:
        flag.unlink()
    deadline = time.monotonic() + 30
    while not out.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the sampler wrote nothing (is bench/_sampler on the daemon's PYTHONPATH?)")
        time.sleep(0.05)
    result: dict[str, Any] = json.loads(out.read_text())
    result["searches"] = len(queries)
    return result


def delays(xs: list[float], measures: str) -> dict[str, Any]:
    return {"rounds": len(xs), "median_ms": round(median(xs) * 1000, 1), "p95_ms": pct_ms(xs, 95, 1),
            "max_ms": pct_ms(xs, 100, 1), "measures": measures}


def poll(done: Any, what: str, limit: float = 30.0) -> float:
    """Seconds until `done()` is true, polled every 10 ms (TimeoutError past `limit`)."""
    t0 = time.perf_counter()
    while not done():
        if time.perf_counter() - t0 > limit:
            raise TimeoutError(f"{what} not within {limit} s")
        time.sleep(0.01)
    return time.perf_counter() - t0


def propagation(tmp: Path, url: str, rounds: int) -> dict[str, Any]:
    srv = start_server("testserver", "http", "--tools", "30", log=tmp / "http-testserver.log")
    try:
        up = store_block(url) + f'[[upstream]]\nname = "shared"\ntransport = "http"\nurl = "{srv.url}"\nrelist_interval = 0\n'
        for name in ("pa", "pb", "qa", "qb"):
            (tmp / name).mkdir()
        with Daemon(tmp / "pa", up) as a, Daemon(tmp / "pb", up) as b:
            out = {"catalog_change": catalog_rounds(a, b, rounds), "feedback": feedback_rounds(a, b, rounds, 0),
                   "feedback_spaced": feedback_rounds(a, b, rounds, 1.0, first=rounds)}
        gated = "require_approval = true\n"
        with Daemon(tmp / "qa", up, daemon_extra=gated) as a, Daemon(tmp / "qb", up, daemon_extra=gated) as b:
            out["approval"] = approval_rounds(a, b, rounds)
    finally:
        srv.kill()
    out["port_event"] = port_delays(tmp, url, rounds * 5)
    return out


def catalog_rounds(a: Daemon, b: Daemon, rounds: int) -> dict[str, Any]:
    xs: list[float] = []
    for i in range(rounds):
        tool = f"fresh_{i}"
        out = a.tool("execute_tool", {"name": "shared__add_tool", "arguments": {
            "name": tool, "description": f"Replica propagation probe {i}.", "announce": False}})
        assert not out.get("isError"), out
        t0 = time.perf_counter()
        with a.client() as c:
            c.request("toolatlas/upstream/relist", {"name": "shared"})
        poll(lambda: f"shared__{tool}" in b.search(f"replica propagation probe {i}", 3), f"{tool} on B")
        xs.append(time.perf_counter() - t0)
    return delays(xs, "relist request to A sent .. B's tool_search lists the new tool (includes A's relist)")


def feedback_rounds(a: Daemon, b: Daemon, rounds: int, gap: float, first: int = 0) -> dict[str, Any]:
    """Rounds back to back (`gap` 0: B published its learned state for the round before
    moments ago, so its writer's throttle, a publish at most every 0.5 s, shows), or `gap`
    seconds apart."""
    ingest: list[float] = []
    ranked: list[float] = []
    for i in range(first, first + rounds):
        time.sleep(gap)
        query = f"generated test tool number {i} that returns its input"
        before = b.search(query, 5)
        events = b.status()["learning"]["events"]
        with a.client() as c:  # a search, then a call of one of its results: a usage event on A
            names = [m["name"] for m in c.call_tool("tool_search", {"query": query, "top_k": 5})["structuredContent"]["matches"]]
            gen = [n for n in names[1:] if n.startswith("shared__gen_")]
            tool = gen[1] if len(gen) > 1 else gen[0]
            assert not c.call_tool("execute_tool", {"name": tool, "arguments": {"value": "x"}}).get("isError")
        t0 = time.perf_counter()
        ingest.append(poll(lambda: b.status()["learning"]["events"] > events, "the event in B's learned state"))
        rank_before = before.index(tool) if tool in before else len(before)
        try:
            poll(lambda: tool in (got := b.search(query, 5)) and got.index(tool) < rank_before, "B's ranking", 5.0)
            ranked.append(time.perf_counter() - t0)
        except TimeoutError:
            pass  # one event was not enough to move it above the tools before it: not counted
    out = delays(ingest, "A answered the execute_tool that made the usage event .. B's catalog_status "
                         "learning.events counts it (B's published learned state holds it)")
    out["gap_s"] = gap
    out["ranking"] = delays(ranked, "the same start .. B's tool_search ranks the tool higher than before it") \
        if ranked else {"rounds": 0}
    return out


def approval_rounds(a: Daemon, b: Daemon, rounds: int) -> dict[str, Any]:
    found: dict[str, list[float]] = {"approve": [], "reject": []}
    for _ in range(rounds):
        for verb, serving in (("approve", True), ("reject", False)):
            t0 = time.perf_counter()
            with a.client() as c:
                c.request(f"toolatlas/upstream/{verb}", {"name": "shared"})
            poll(lambda: ("shared__echo" in b.search("echo the message back", 5)) == serving, f"{verb} on B")
            found[verb].append(time.perf_counter() - t0)
    return {verb: delays(xs, f"{verb} request to A sent .. B's tool_search {'serves' if verb == 'approve' else 'stops serving'} "
                             "the upstream") for verb, xs in found.items()}


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
    p.add_argument("--queries", type=int, default=200, help="search queries per round, per daemon")
    p.add_argument("--search-rounds", type=int, default=8)
    p.add_argument("--rounds", type=int, default=20, help="propagation rounds (each kind)")
    p.add_argument("--profile", action="store_true", help="sample the with-store daemon's stacks during searches")
    p.add_argument("--only", default="cold,search,propagation", help="comma-separated parts to run")
    args = p.parse_args(argv)
    parts = set(args.only.split(","))
    pg = PgServer()
    result: dict[str, Any] = {"tools": args.tools, "loadavg_before": os.getloadavg(), "nproc": os.cpu_count()}
    try:
        url = pg.new_database()
        with tempfile.TemporaryDirectory(prefix="ta-replicas-") as tmp_s:
            tmp = Path(tmp_s)
            if parts & {"cold", "search"}:
                result.update(cold_and_search(tmp, url, args, parts))
            if "propagation" in parts:
                result["propagation"] = propagation(tmp, url, args.rounds)
    finally:
        pg.close()
    result["loadavg_after"] = os.getloadavg()
    emit(result, "replicas")
    return 0


def cold(tmp: Path, url: str, n: int) -> tuple[dict[str, Any], Daemon]:
    """The three cold starts; every daemon stopped at the end (`alone`, settled, seeds the
    search part's twins)."""
    alone, result_alone = cold_start(tmp, "alone", n, "")
    daemons = [alone]
    try:
        # Each start is timed on an otherwise quiet toolatlas: the one before has finished
        # its after-start work (Rift, token counts, snapshot) first.
        result_alone["settled_before_next"] = wait_settled(lambda: try_status(alone.socket), 900)[0]
        first, result_first = cold_start(tmp, "first", n, store_block(url))
        daemons.append(first)
        deadline = time.monotonic() + 120
        while (s := (try_status(first.socket) or {}).get("store", {})).get("vectors_pending", 1) or \
                s.get("vectors_stored", 0) < result_first["embeddings_computed"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"first replica's vectors not stored: {s}")
            time.sleep(0.1)
        first.stop()
        second, result_second = cold_start(tmp, "second", n, store_block(url))
        daemons.append(second)
    finally:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
    return {"alone": result_alone, "first_with_store": result_first, "second_with_store": result_second,
            "second_over_alone": round(result_second["hybrid_s"] / result_alone["hybrid_s"], 3)}, alone


def twin(tmp: Path, name: str, n: int, store: str, env: dict[str, str] | None) -> Daemon:
    """A warm restart on `tmp/name/state` (a copy of one settled daemon's state: the same
    index snapshot and HNSW graph), with `store` as its [store] block or none; settled."""
    d = Daemon(tmp / name, store + upstream_block("big", n, extra="relist_interval = 0\n"), search_extra='embedder = "onnx"\n')
    d.start(wait_ready=900, env=env)
    wait_settled(lambda: try_status(d.socket), 900)
    if store:
        deadline = time.monotonic() + 120
        while (s := (try_status(d.socket) or {}).get("store", {})).get("buffered", 1) or not s.get("connected"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: store not connected or buffer not sent: {s}")
            time.sleep(0.1)
    return d


def search_twins(tmp: Path, url: str, source: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Two daemons from copies X and Y of `source` (a settled state_dir); the first half of
    the rounds with the store on X, the second half on Y, so whatever differs between the two
    processes (placement, memory) falls on both sides. See `search_ab`."""
    import shutil

    for name in ("twin_x", "twin_y"):
        (tmp / name).mkdir()
        shutil.copytree(source, tmp / name / "state", symlinks=True, ignore=shutil.ignore_patterns("store"))
    n = args.queries * args.search_rounds
    queries = bench_queries(n + (args.queries if args.profile else 0))
    half = args.search_rounds // 2
    sample_out = tmp / "sample.json"
    env = None
    if args.profile:
        env = {"PYTHONPATH": os.pathsep.join([str(SAMPLER), *caller_pythonpath()]), "TA_SAMPLE_OUT": str(sample_out)}
    rows: list[dict[str, Any]] = []
    profile: dict[str, Any] | None = None
    for part, (with_store, without) in enumerate((("twin_x", "twin_y"), ("twin_y", "twin_x"))):
        rounds = half if part == 0 else args.search_rounds - half
        w = twin(tmp, with_store, args.tools, store_block(url), env if part == 1 else None)
        try:
            wo = twin(tmp, without, args.tools, "", None)
            try:
                first = args.queries * (0 if part == 0 else half)
                res = search_ab(wo, w, queries[first:first + args.queries * rounds], rounds)
                rows += [dict(r, with_store_on=with_store) for r in res["per_round"]]
                if args.profile and part == 1:
                    profile = profile_searches(w, sample_out, queries[n:])
            finally:
                wo.stop()
        finally:
            w.stop()
    med_without = median([r["p95_without_ms"] for r in rows])
    med_with = median([r["p95_with_ms"] for r in rows])
    out: dict[str, Any] = {
        "design": "twins: two warm restarts from copies of one settled state_dir; the store on X for the first half "
                  "of the rounds, on Y for the second",
        "rounds": len(rows), "queries_per_round": args.queries, "per_round": rows,
        "median_p95_without_ms": med_without, "median_p95_with_ms": med_with,
        "ratio_of_median_p95": round(med_with / med_without, 3),
        "median_round_ratio": median([r["ratio"] for r in rows]),
        "rounds_with_store_faster": sum(r["ratio"] < 1 for r in rows),
        "load_1m_min_max": [min(r["load_1m"] for r in rows), max(r["load_1m"] for r in rows)],
    }
    if profile is not None:
        out["profile"] = profile
    return out


def cold_and_search(tmp: Path, url: str, args: argparse.Namespace, parts: set[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if "cold" in parts:
        result["cold_start"], alone = cold(tmp, url, args.tools)
    else:  # the search part alone: one settled daemon seeds the twins' state
        alone, _ = cold_start(tmp, "alone", args.tools, "")
        try:
            wait_settled(lambda: try_status(alone.socket), 900)
        finally:
            alone.stop()
    if "search" in parts:
        result["search"] = search_twins(tmp, url, alone.tmp / "state", args)
    return result


if __name__ == "__main__":
    sys.exit(main())
