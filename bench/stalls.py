"""Event-loop stalls from upstream size (issue #15 item 8): how long another client waits.

    .venv/bin/python bench/stalls.py [--tools 20000] [--relists 3] [--unknown 5]
        [--blocks 400000] [--description-bytes 5000000]

A real daemon (BM25 only) federates the hostile stdio upstream (tests/support/servers/
hostile.py). While each trigger runs, a probe client on its own socket connection sends
small `tool_search` requests back to back (bounded by a deadline) and records each round
trip; the figure is the longest one (`max_wait_ms`), next to the probe's median and the
same probe with no trigger running (`idle`). Triggers:

- `relist`: a 20,000-tool upstream changes one description and announces list_changed; the
  window lasts until the index version moves (the re-list was applied), `--relists` times;
- `unknown_name`: execute_tool with a misspelt name against the 20,000-tool catalog
  (the close-match suggestion), `--unknown` times;
- `blocks`: a tool result of 400,000 content blocks; what the caller got is reported;
- `big_description`: on a second daemon whose upstream has a 5 MB description, the first
  `catalog_status` after the catalog appeared (token accounting) until its token figures
  are in, then one tool_search that matches that tool (the size of its answer is reported).

Prints JSON and writes bench/out/stalls.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import Daemon, emit, median, pct_ms

from tests.support.daemon import hostile_upstream
from toolatlas.surface.rawclient import RawClient

PROBE_QUERY = {"query": "fetch record", "top_k": 1}
WINDOW_LIMIT_S = 300.0  # no trigger window lasts longer (bounds every loop)


def probe_during(d: Daemon, trigger: Callable[[], Any]) -> dict[str, Any]:
    """Run `trigger()` in this thread while a probe client times tool_search round trips."""
    waits: list[float] = []
    stop = threading.Event()
    ready = threading.Event()

    def probe() -> None:
        with RawClient(d.socket, timeout=WINDOW_LIMIT_S) as c:
            c.call_tool("tool_search", PROBE_QUERY)
            ready.set()
            deadline = time.monotonic() + WINDOW_LIMIT_S
            while not stop.is_set() and time.monotonic() < deadline:
                t0 = time.perf_counter()
                c.call_tool("tool_search", PROBE_QUERY)
                waits.append(time.perf_counter() - t0)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    ready.wait(60)
    t0 = time.perf_counter()
    try:
        outcome = trigger()
    finally:
        elapsed = time.perf_counter() - t0
        stop.set()
        t.join(WINDOW_LIMIT_S)
    return {"max_wait_ms": round(max(waits) * 1000, 1) if waits else None,
            "median_ms": round(median(waits) * 1000, 2) if waits else None,
            "p99_ms": pct_ms(waits, 99, 1) if waits else None,
            "probes": len(waits), "trigger_s": round(elapsed, 2), "outcome": outcome}


def wait_index_moves(d: Daemon, before: int) -> int:
    return int(d.wait_for(lambda: (v := d.status()["index"]["version"]) > before and v, WINDOW_LIMIT_S, "re-index"))


def relists(d: Daemon, n: int) -> dict[str, Any]:
    def trigger() -> dict[str, Any]:
        for _ in range(n):
            version = d.status()["index"]["version"]
            d.tool("hostile__relist", {})
            wait_index_moves(d, version)
        return {"relists": n}

    return probe_during(d, trigger)


def unknown_names(d: Daemon, n: int) -> dict[str, Any]:
    def trigger() -> dict[str, Any]:
        texts = []
        with RawClient(d.socket, timeout=WINDOW_LIMIT_S) as c:
            for i in range(n):
                r = c.call_tool("execute_tool", {"name": f"hostile__many_{i * 997:05d}_fetch_recrod", "arguments": {}})
                texts.append(r["content"][0]["text"][:160])
        return {"calls": n, "first_message": texts[0] if texts else None}

    return probe_during(d, trigger)


def blocks(d: Daemon, n: int) -> dict[str, Any]:
    def trigger() -> dict[str, Any]:
        with RawClient(d.socket, timeout=WINDOW_LIMIT_S) as c:
            r = c.call_tool("execute_tool", {"name": "hostile__blocks", "arguments": {"n": n}})
        content = r.get("content") or []
        return {"is_error": bool(r.get("isError")), "blocks_returned": len(content),
                "first_text": (content[0].get("text") or "")[:240] if content else None}

    return probe_during(d, trigger)


def token_figures(d: Daemon) -> dict[str, Any]:
    """catalog_status's token figures once they count the current index version."""
    def current() -> dict[str, Any] | None:
        st = d.status()
        t = st["tokens"]
        return t if t.get("index_version") == st["index"]["version"] else None

    return dict(d.wait_for(current, WINDOW_LIMIT_S, "token figures"))


def big_description(d: Daemon) -> dict[str, Any]:
    token_figures(d)  # the start's own count is done

    def change_then_status() -> dict[str, Any]:
        version = d.status()["index"]["version"]
        d.tool("hostile__relist", {})
        wait_index_moves(d, version)
        tokens = token_figures(d)  # the first catalog_status after the change starts the count
        return {"full_catalog_tokens": tokens.get("full_catalog_tokens"), "error": tokens.get("error")}

    def search() -> dict[str, Any]:
        with RawClient(d.socket, timeout=WINDOW_LIMIT_S) as c:
            r = c.call_tool("tool_search", {"query": "a tool whose description never ends", "top_k": 3})
        matches = r["structuredContent"]["matches"]
        doc = next((m for m in matches if m["name"] == "hostile__huge_doc"), None)
        return {"huge_doc_found": doc is not None,
                "description_chars": len(doc["description"]) if doc else None}

    return {"change_and_catalog_status": probe_during(d, change_then_status), "search_hit": probe_during(d, search)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tools", type=int, default=20_000)
    p.add_argument("--relists", type=int, default=3)
    p.add_argument("--unknown", type=int, default=5)
    p.add_argument("--blocks", type=int, default=400_000)
    p.add_argument("--description-bytes", type=int, default=5_000_000)
    a = p.parse_args()
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]}
    relist_block = "relist_interval = 0\nping_interval = 0\n"
    with tempfile.TemporaryDirectory(prefix="stalls-") as tmp:
        for sub in ("many", "big"):
            os.makedirs(Path(tmp) / sub)
        d = Daemon(Path(tmp) / "many", hostile_upstream("--tools", str(a.tools - 2), extra=relist_block))  # + blocks, relist
        try:
            d.start(wait_ready=WINDOW_LIMIT_S)
            d.wait_for(lambda: d.status()["tools"] >= a.tools, WINDOW_LIMIT_S, "catalog listed")
            token_figures(d)
            out["idle"] = probe_during(d, lambda: time.sleep(3))
            out["relist"] = relists(d, a.relists)
            out["unknown_name"] = unknown_names(d, a.unknown)
            out["blocks"] = blocks(d, a.blocks)
        finally:
            d.__exit__(None, None, None)
        up = hostile_upstream("--tools", "1", "--description-bytes", str(a.description_bytes), extra=relist_block)
        d = Daemon(Path(tmp) / "big", up)
        try:
            d.start(wait_ready=WINDOW_LIMIT_S)
            out["big_description"] = big_description(d)
        finally:
            d.__exit__(None, None, None)
    out["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    emit(out, "stalls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
