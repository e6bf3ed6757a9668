"""Soak: does anything in a long-running daemon grow without bound? ("trust it for months")

    .venv/bin/python bench/soak.py [--rounds 12] [--quick] [--probe] [--trace N]

One real `toolatlas serve` as a user runs it (`embedder = "onnx"`, the ONNX export linked in)
with two upstreams, the project's test server on stdio (`local`) and on streamable HTTP
(`remote`, started here), and its own `[http] listen` endpoint with a token. Every round is
the same bounded work:

1. 40 short-lived Unix-socket connections (RawClient): each a tool_search with a query never
   sent before, then execute_tool of an echo tool it returned (a learning event);
2. one connection: 200 execute_tool calls and 100 distinct searches, interleaved;
3. 10 streamable-HTTP sessions with the SDK client (2025-11-25 sessions: initialize, one
   search, one execute), half closed properly (DELETE), half abandoned (the client's
   connections dropped, no DELETE);
4. catalog churn: `add_tool` of this round's tool on the stdio server; on the HTTP server
   `add_tool` of this round's tool and `remove_tool` of the previous round's (the stdio
   server's tools added at run time die with it in step 5: its relist after the restart is
   the removal there); each list_changed is a reindex;
5. SIGKILL of the stdio upstream's child, then a wait (deadline) until catalog_status shows
   `local` ready again with a new child.

After each round (a 2 s settle, then `wait_settled`) the daemon's VmRSS, open fds, threads,
live descendant processes and catalog_status's learning events are read; then, once the
document model has been released (`embed.doc_model_released` in the log, ~30 s after the
round's last tool embedding), VmRSS and threads again (`rss_rest_mb`, `threads_rest`: the
figures that compare across rounds). With `--probe` also (SIGUSR2 to bench/memprobe, on the
daemon's PYTHONPATH) the live Python objects by type (frozen ones included), the asyncio
tasks by coroutine, and with `--trace N` tracemalloc's traced MB by site (the probe's other
TOOLATLAS_MEMPROBE_* switches pass through from this process's environment).
Prints one row per round and the growth per round from round 3 to the last (from round 1
with fewer than 4 rounds). `--quick`: 3 rounds, a smoke run. Prints JSON (bench/out/soak.json).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from _common import (REPO, Daemon, caller_pythonpath, descendants, emit, memprobe_report, proc_mem_mb, start_server,
                     stdio_testserver, wait_settled)
from tests.support.daemon import url_upstream
from tests.support.ports import free_port
from tests.support.servers import TESTSERVER
from toolatlas.surface.http import hash_token

PROBE = Path(__file__).resolve().parent / "memprobe"
TOKEN = "soak-token"
SOCKET_CONNS, CALLS, SEARCHES, HTTP_SESSIONS = 40, 200, 100, 10
RELEASED = "embed.doc_model_released"
WORDS = ["amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "jasper",
         "kelp", "lagoon", "marble", "nebula", "onyx", "prairie", "quartz", "reef", "sierra", "tundra"]


def word(n: int) -> str:
    """A distinct short phrase for each n (queries are never repeated across the run)."""
    return f"{WORDS[n % 20]} {WORDS[(n // 20) % 20]} {n}"


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert not result.get("isError"), result
    return result


def echo_of(matches: list[dict[str, Any]]) -> str:
    return next(m["name"] for m in matches if m["name"].endswith("__echo"))


def socket_phase(d: Daemon, rnd: int) -> None:
    for i in range(SOCKET_CONNS):
        with d.client() as c:
            q = f"echo my message back to me ({word(rnd * 1000 + i)})"
            found = ok(c.call_tool("tool_search", {"query": q, "top_k": 5}))["structuredContent"]["matches"]
            ok(c.call_tool("execute_tool", {"name": echo_of(found), "arguments": {"message": f"soak {rnd}/{i}"}}))
    with d.client() as c:
        for i in range(CALLS):
            if i % 2 == 0:
                q = f"repeat the text I send ({word(rnd * 1000 + 500 + i)})"
                ok(c.call_tool("tool_search", {"query": q, "top_k": 5}))
            name = "local__echo" if i % 2 else "remote__echo"
            ok(c.call_tool("execute_tool", {"name": name, "arguments": {"message": f"call {rnd}/{i}"}}))


@asynccontextmanager
async def _transport(url: str, close: bool) -> AsyncIterator[Any]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
        async with streamable_http_client(url, http_client=http, terminate_on_close=close) as streams:
            yield streams


async def http_phase(url: str, rnd: int) -> None:
    with anyio.fail_after(120):
        for i in range(HTTP_SESSIONS):
            async with Client(_transport(url, close=i % 2 == 0), mode="legacy") as c:
                q = f"say back what I wrote ({word(rnd * 1000 + 800 + i)})"
                found = await c.call_tool("tool_search", {"query": q, "top_k": 5})
                name = echo_of(found.structured_content["matches"])
                done = await c.call_tool("execute_tool", {"name": name, "arguments": {"message": "over http"}})
                assert not done.is_error, done


def churn_phase(d: Daemon, rnd: int) -> None:
    with d.client() as c:
        for server in ("local", "remote"):
            ok(c.call_tool("execute_tool", {"name": f"{server}__add_tool", "arguments": {
                "name": f"churn_{rnd}", "description": f"Survey the {word(rnd)} deposits and chart them."}}))
        if rnd > 0:
            ok(c.call_tool("execute_tool", {"name": "remote__remove_tool", "arguments": {"name": f"churn_{rnd - 1}"}}))
    d.wait_for(lambda: f"local__churn_{rnd}" in d.search(f"Survey the {word(rnd)} deposits and chart them.", 3),
               60, f"churn_{rnd} searchable")


def stdio_child(pid: int) -> int:
    for p in descendants(pid):
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(TESTSERVER).encode() in argv and b"stdio" in argv:
            return p
    raise LookupError("no stdio test server among the daemon's descendants")


def server_state(d: Daemon, name: str) -> str:
    return next(s["state"] for s in d.status()["servers"] if s["name"] == name)


def kill_phase(d: Daemon, pid: int) -> float:
    victim = stdio_child(pid)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()

    def back() -> bool:
        try:
            child = stdio_child(pid)
        except LookupError:
            return False
        return child != victim and server_state(d, "local") == "ready"

    d.wait_for(back, 120, "the stdio upstream ready again after SIGKILL")
    return round(time.monotonic() - t0, 2)


def measure(d: Daemon, rnd: int, phases: dict[str, float], releases: int, probe_out: Path | None) -> dict[str, Any]:
    assert d.proc is not None
    pid = d.proc.pid
    time.sleep(2.0)
    settled, st = wait_settled(d.status, 180)
    row: dict[str, Any] = {
        "round": rnd + 1, "settled": settled, "rss_mb": proc_mem_mb(pid)["VmRSS"],
        "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": len(os.listdir(f"/proc/{pid}/task")),
        "children": len(descendants(pid)), "learning_events": (st.get("learning") or {}).get("events"),
        "tools": st.get("tools"), "index_version": (st.get("index") or {}).get("version"),
        "clients": st.get("clients"), "load_1m": round(os.getloadavg()[0], 2), "phase_s": phases,
    }
    # The document model (~90 MB) is released DOC_MODEL_IDLE_S after its last use (every round
    # embeds its new tools): the resident size at rest, after that, is the comparable one.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and d.log.read_text().count(RELEASED) <= releases:
        time.sleep(0.5)
    row["model_released"] = d.log.read_text().count(RELEASED) > releases
    row["rss_rest_mb"] = proc_mem_mb(pid)["VmRSS"]
    row["threads_rest"] = len(os.listdir(f"/proc/{pid}/task"))
    if probe_out is not None:
        row["probe"] = memprobe_report(d, probe_out, 120)
    return row


def growth(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = rows[2] if len(rows) >= 4 else rows[0]
    last = rows[-1]
    n = last["round"] - first["round"]
    out: dict[str, Any] = {"from_round": first["round"], "to_round": last["round"]}
    for key, unit in (("rss_mb", "mb"), ("rss_rest_mb", "rest_mb"), ("fds", "fds"), ("threads", "threads"),
                      ("threads_rest", "threads_rest"), ("children", "children"),
                      ("learning_events", "events")):
        out[f"{unit}_per_round"] = round((last[key] - first[key]) / n, 2) if n else None
    return out


def type_growth(rows: list[dict[str, Any]], top: int = 40) -> dict[str, Any]:
    """Object counts by type and asyncio tasks by coroutine, from round 3 (or 1) to the last."""
    probed = [r["probe"] for r in rows if "types" in r.get("probe", {})]
    if len(probed) < 2:
        return {}
    first, last = (probed[2] if len(probed) >= 4 else probed[0]), probed[-1]
    n = (rows[-1]["round"] - rows[2]["round"]) if len(rows) >= 4 else (rows[-1]["round"] - rows[0]["round"])
    out: dict[str, Any] = {"objects_per_round": round((last["objects"] - first["objects"]) / n, 1),
                           "tasks_per_round": round((last["task_count"] - first["task_count"]) / n, 1)}
    for key in ("types", "tasks"):
        a, b = first.get(key, {}), last.get(key, {})
        diff = {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b)}
        out[key] = dict(sorted(((k, v) for k, v in diff.items() if v), key=lambda kv: -abs(kv[1]))[:top])
    return out


def run(rounds: int, use_probe: bool, trace: int) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "soak", "rounds": rounds, "machine_cores": os.cpu_count(),
                              "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="toolatlas-soak-") as tmp_s:
        tmp = Path(tmp_s)
        remote = start_server("testserver", "http", log=tmp / "remote.log")
        try:
            port = free_port()
            http = (f'[http]\nlisten = "127.0.0.1:{port}"\n'
                    f'[[http.tokens]]\nname = "soak"\nsha256 = "{hash_token(TOKEN)}"\n')
            d = Daemon(tmp, http + stdio_testserver("local") + url_upstream("remote", "http", remote.url),
                       search_extra='embedder = "onnx"\n')
            env: dict[str, str] = {}
            probe_out = tmp / "probe.json" if use_probe else None
            if use_probe:
                env = {"PYTHONPATH": os.pathsep.join([str(PROBE), *caller_pythonpath(), str(REPO / "daemon")]),
                       "TOOLATLAS_MEMPROBE_OUT": str(probe_out), "TOOLATLAS_MEMPROBE_TYPES": "1"}
                if trace:
                    env["TOOLATLAS_MEMPROBE_TRACE"] = str(trace)
            with d.start(wait_ready=300, env=env):
                assert d.proc is not None
                d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 120, "upstreams ready")
                settled, _ = wait_settled(d.status, 300)
                url = f"http://127.0.0.1:{port}/mcp"
                rows = []
                t_all = time.monotonic()
                for rnd in range(rounds):
                    phases: dict[str, float] = {}
                    releases = d.log.read_text().count(RELEASED)
                    t = time.monotonic()
                    socket_phase(d, rnd)
                    phases["socket_s"] = round(time.monotonic() - t, 1)
                    t = time.monotonic()
                    anyio.run(http_phase, url, rnd)
                    phases["http_s"] = round(time.monotonic() - t, 1)
                    t = time.monotonic()
                    churn_phase(d, rnd)
                    phases["churn_s"] = round(time.monotonic() - t, 1)
                    phases["kill_to_ready_s"] = kill_phase(d, d.proc.pid)
                    row = measure(d, rnd, phases, releases, probe_out)
                    rows.append(row)
                    brief = {k: row[k] for k in ("round", "rss_mb", "rss_rest_mb", "fds", "threads", "threads_rest",
                                                 "children", "learning_events",
                                                 "tools", "settled", "load_1m")}
                    print(json.dumps(brief), file=sys.stderr, flush=True)
                result["duration_s"] = round(time.monotonic() - t_all, 1)
                result["initially_settled"] = settled
        finally:
            remote.stop()
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["per_round"] = {"socket_connections": SOCKET_CONNS, "socket_calls": CALLS, "socket_searches": SEARCHES,
                           "http_sessions": HTTP_SESSIONS, "http_abandoned": HTTP_SESSIONS // 2,
                           "stdio_child_kills": 1, "tools_added": 2, "tools_removed": 1}
    result["rows"] = [{k: v for k, v in r.items() if k != "probe"} for r in rows]
    result["growth"] = growth(rows)
    if use_probe:
        result["probe_growth"] = type_growth(rows)
        result["probes"] = [{k: r["probe"].get(k) for k in ("rss_mb", "rss_after_gc_mb", "rss_after_trim_mb",
                                                             "traced_mb", "objects", "task_count")} for r in rows]
        if trace:
            result["traced_by_site_last"] = rows[-1]["probe"].get("traced_by_toolatlas_site_mb")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--quick", action="store_true", help="3 rounds (a smoke run)")
    p.add_argument("--probe", action="store_true", help="object counts by type and asyncio tasks after each round")
    p.add_argument("--trace", type=int, default=0, help="with --probe: tracemalloc frames (slow; 0: off)")
    a = p.parse_args()
    emit(run(3 if a.quick else a.rounds, a.probe or bool(a.trace), a.trace), "soak")


if __name__ == "__main__":
    main()
