"""The pieces of a cache-hit tool_search, timed in process, in one or more trees.

    .venv/bin/python bench/hit_parts.py [--tree PATH ...] [--rounds 3]

Each tree (a checkout; default this one) runs in its own subprocess with its `daemon/` first
on the path, alternating trees round by round. Per piece the minimum over repeats of the mean
time per operation (us), then the median of the rounds:

* `event_emit`: one tool_search_completed event (the fields a hit writes, two secrets configured)
* `metrics`: observe_search + count_endpoint_request for one hit
* `match_carded` / `match_plain`: one match with / without a verified card
* `timestamp`: rfc3339_now
* `sanitize_tool`: one dev-catalog tool's description and schema sanitized, the mean over both
  catalogs (what a match costs the first time its tool is shown: misses over a big catalog)
* `scope_per_message_old` / `_new`: the socket reader's wait around one receive, as a
  move_on_after per message (before stop 30) and as one scope whose deadline moves (after),
  minus a bare checkpoint (anyio only: the same in every tree)
* `lock_default` / `lock_fast`: an uncontended anyio Lock acquire/release (anyio only)

What a whole hit costs through the socket, against another commit, is `ab.py`'s to say; this
shows where a difference comes from. Prints JSON (bench/out/hit_parts.json).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _best(fn: Any, number: int, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def child(tree: Path) -> dict[str, float]:
    sys.path[:0] = [str(tree / "daemon"), str(tree)]
    import anyio
    import anyio.lowlevel

    from toolatlas.events import TOOL_SEARCH_COMPLETED, Events, rfc3339_now
    from toolatlas.metrics import Metrics

    out: dict[str, float] = {}
    ev = Events(io.StringIO(), secrets=["tok-abcdefghijkl", "Bearer zzzzyyyyxxxx"])
    ev.environment = "production"
    fields = dict(query="echo the message back", results=5, matched_servers=["everything", "files"], latency_ms=0.123,
                  top_k=5, scope="all", mode="hybrid", cache="hit", principal="uid:0", user="uid 0 (root)",
                  client="bench", client_version="1.0", endpoint="default", connection=12, request=345)

    def emit() -> None:
        ev._stream = io.StringIO()
        ev.emit(TOOL_SEARCH_COMPLETED, **fields)

    out["event_emit"] = _best(emit, 2000)
    m = Metrics()

    def metrics() -> None:
        m.observe_search(0.0001, mode="hybrid", cache_hit=True, results=5)
        m.count_endpoint_request("default", "tool_search")

    out["metrics"] = _best(metrics, 2000)
    out["timestamp"] = _best(rfc3339_now, 20000)
    try:
        from tests.unit.test_matches import REC, _verdict
        from toolatlas.gateway.matches import MatchBuilder
    except ImportError:  # a tree from before the matches module
        pass
    else:
        builder = MatchBuilder()
        carded = _verdict("Converts units. Inputs: value.", ["10 mi in km", "72 F in C"])
        out["match_carded"] = _best(lambda: builder.match(REC, carded, 0.5123), 5000)
        out["match_plain"] = _best(lambda: builder.match(REC, None, 0.5123), 5000)

    try:
        from toolatlas.catalog.sanitize import sanitize_schema, sanitize_text
    except ImportError:  # a tree from before the sanitizer
        pass
    else:
        tools = []
        for ds in ("toollens", "mcptoolbenchpp"):
            for line in (REPO.parent / "shared" / "benchdata" / ds / "catalog.jsonl").read_text().splitlines():
                row = json.loads(line)
                tools.append((row.get("description") or "", row.get("input_schema") or {}))

        def sanitize_all() -> None:
            for description, schema in tools:
                sanitize_text(description)
                sanitize_schema(schema)

        out["sanitize_tool"] = _best(sanitize_all, 1, 5) / len(tools)

    n = 20000

    async def loop_us(body: Any) -> float:
        t = time.perf_counter()
        await body()
        return (time.perf_counter() - t) / n * 1e6

    async def bare() -> None:
        for _ in range(n):
            await anyio.lowlevel.checkpoint()

    async def old() -> None:
        for _ in range(n):
            with anyio.move_on_after(30.0):
                await anyio.lowlevel.checkpoint()

    async def new() -> None:
        with anyio.CancelScope() as scope:
            for _ in range(n):
                scope.deadline = anyio.current_time() + 30.0
                await anyio.lowlevel.checkpoint()
                scope.deadline = math.inf

    def locking(fast: bool) -> Any:
        async def body() -> None:
            lock = anyio.Lock(fast_acquire=fast)
            for _ in range(n):
                async with lock:
                    pass
        return body

    async def wire() -> None:
        base = min([await loop_us(bare) for _ in range(3)])
        out["scope_per_message_old"] = min([await loop_us(old) for _ in range(3)]) - base
        out["scope_per_message_new"] = min([await loop_us(new) for _ in range(3)]) - base
        out["lock_default"] = min([await loop_us(locking(False)) for _ in range(3)])
        out["lock_fast"] = min([await loop_us(locking(True)) for _ in range(3)])

    anyio.run(wire, backend_options={"use_uvloop": True})
    return {k: round(v, 2) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", type=Path, help="a checkout to time (repeatable; default: this one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child)))
        return
    trees = [t.resolve() for t in (a.tree or [REPO])]
    runs: dict[str, list[dict[str, float]]] = {str(t): [] for t in trees}
    load = [round(x, 2) for x in os.getloadavg()]
    for _ in range(a.rounds):
        for t in trees:
            res = subprocess.run([sys.executable, __file__, "--child", str(t)], check=True, capture_output=True,
                                 text=True)
            runs[str(t)].append(json.loads(res.stdout))
    out: dict[str, Any] = {"bench": "hit_parts", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "load_start": load, "rounds": a.rounds, "us": {}}
    for t, rows in runs.items():
        out["us"][t] = {k: round(statistics.median(r[k] for r in rows if k in r), 2) for k in rows[0]}
    sys.path.insert(0, str(REPO / "bench"))
    from _common import emit

    emit(out, "hit_parts")


if __name__ == "__main__":
    main()
