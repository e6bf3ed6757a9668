"""Daemon cold start, warm restart and resident memory with a ~2,000-tool catalog indexed.

    .venv/bin/python bench/startup.py [--tools 2000] [--embedder onnx] [--restarts 3] [--queries 200]
    .venv/bin/python bench/startup.py --restart 10 [--embedder none]

A real `toolatlas serve` (the test harness's config: one stdio upstream, the default hybrid
ranker with the ONNX embedder) federates one stdio upstream, `bench/catalog_upstream.py`:
ToolLens + MCPToolBench++ from ../shared/benchdata (513 published tools), replicated with
varied names and a variant phrase until it holds N tools, so every document text is distinct
and must really be embedded.

* cold: an empty state_dir (only the ONNX model export is linked in: a one-time step per
  machine, not per state_dir). Clocks start at the spawn of `toolatlas serve` and stop at
  the first answered catalog_status (socket_answers), at the first catalog_status that says `index.ready` (READY), at the first status whose engine
  holds all N tools (indexed), and at the first tool_search that returns a match.
* warm: the same state_dir, the same catalog, `--restarts` times. Same clocks, plus the
  engine's `embeddings_computed` once the upstream's catalog has been re-applied (must be 0:
  everything comes from the embedding cache and the index snapshot).
* socket search latency (after the last restart, once the daemon's background Rift analysis
  of the catalog has finished, or after 90 s): `--queries` distinct ToolLens test queries as tool_search
  over one Unix-socket connection (cache misses), then the same again (hits).
* memory: VmRSS and VmHWM of the daemon process (from /proc, upstream children excluded,
  reported apart) with the catalog indexed, after 50 searches.

`--restart N` (issue 16) instead measures what a client sees across N daemon restarts: a
client calls tool_search and execute_tool through `toolatlas shim` in a loop while the
daemon is SIGKILLed and started again; per restart the time from the kill to its first good
answer of each, the span of errors it saw, and how much of that the shim adds (from the
socket accepting again to the first good search); median and p95. Writes
bench/out/startup_restart.json.

`--fresh [--runs 5] [--hybrid-runs K] [--cases example,2000]` measures the real first start instead (issue 16
item 4; bench/fresh_start.py): an empty state_dir without the ONNX export, median of `--runs`
time to the first correct tool_search answer and to hybrid search, for the example config
and a 2,000-tool upstream; prints JSON and writes bench/out/startup_fresh.json.

Goals (issue 3): cold indexing of 2,000 tools <= 60 s; a restart serves its first search
within 5 s with zero new embeddings; daemon RSS <= 400 MB; tool_search p95 <= 15 ms at 2,000. Prints JSON and writes
bench/out/startup.json. Polls every 50 ms, so each time is within ~50 ms (plus one status
round trip) of the event.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import emit, median, pct_ms, proc_mem_mb, wait_settled
from catalog_upstream import upstream_block

REPO = Path(__file__).resolve().parents[1]
BENCHDATA = REPO / ".." / "shared" / "benchdata"
UPSTREAM = "catalog"
POLL_S = 0.05
RIFT_WAIT_S = 90  # at most this long for the daemon's background work (Rift, tokens, snapshot) before timing searches
QUERIES = ["get the weather forecast for a city", "search recent news articles", "convert currency amounts",
           "read a file from disk", "translate text into another language", "find recipes with chicken"]


# -- the daemon ------------------------------------------------------------------------------

def try_status(sock: str) -> dict[str, Any] | None:
    from toolatlas.surface.rawclient import RawClient, RpcError

    try:
        with RawClient(sock, timeout=30) as c:
            r = c.call_tool("catalog_status", {})
    except (OSError, ConnectionError, ValueError, RpcError):
        return None
    return None if r.get("isError") else r.get("structuredContent")


def try_search(sock: str, query: str) -> list[str]:
    from toolatlas.surface.rawclient import RawClient, RpcError

    try:
        with RawClient(sock, timeout=30) as c:
            r = c.call_tool("tool_search", {"query": query, "top_k": 5})
    except (OSError, ConnectionError, ValueError, RpcError):
        return []
    if r.get("isError"):
        return []
    return [m["name"] for m in (r.get("structuredContent") or {}).get("matches", [])]


def socket_latency(sock: str, queries: list[str]) -> dict[str, Any]:
    """tool_search end to end over one socket connection: distinct queries (cache misses),
    then the same queries again (cache hits); milliseconds."""
    from toolatlas.surface.rawclient import RawClient

    out: dict[str, Any] = {"queries": len(queries), "top_k": 5, "client": "toolatlas.surface.rawclient over the Unix socket"}
    with RawClient(sock, timeout=60) as c:
        for kind in ("miss", "hit"):
            xs = []
            for q in queries:
                t = time.perf_counter()
                r = c.call_tool("tool_search", {"query": q, "top_k": 5})
                xs.append(time.perf_counter() - t)
                assert not r.get("isError"), r
            out[kind] = {"n": len(xs), "p50_ms": pct_ms(xs, 50), "p95_ms": pct_ms(xs, 95), "max_ms": pct_ms(xs, 100)}
    return out


def bench_queries(n: int, seed: int = 1) -> list[str]:
    """Distinct real query texts (ToolLens test queries), shuffled."""
    path = BENCHDATA / "toollens" / "queries.jsonl"
    texts = sorted({json.loads(line)["query"] for line in path.read_text().splitlines() if line.strip()})
    random.Random(seed).shuffle(texts)
    return texts[:n]


def one_start(config: Path, sock: str, log: Path, n: int, timeout: float,
              latency_queries: list[str] | None = None) -> dict[str, Any]:
    """Spawn the daemon, time READY / fully indexed / first search, measure memory, stop it."""
    from tests.support.processes import descendants, die_with_parent, pid_alive as alive

    with open(log, "wb") as logfh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolatlas", "serve", "--config", str(config)],
            stdout=logfh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"), preexec_fn=die_with_parent,
        )
        res: dict[str, Any] = {"daemon_pid": proc.pid}
        marks: dict[str, float] = {}
        status: dict[str, Any] | None = None
        try:
            deadline = t0 + timeout
            while time.perf_counter() < deadline and len(marks) < 4:
                if proc.poll() is not None:
                    raise RuntimeError(f"daemon exited with {proc.returncode}: {log.read_text()[-2000:]}")
                if "first_search_s" not in marks and try_search(sock, QUERIES[0]):
                    marks["first_search_s"] = time.perf_counter() - t0
                st = try_status(sock)
                if st is not None:
                    status = st
                    now = time.perf_counter() - t0
                    marks.setdefault("socket_answers_s", now)
                    if st["index"].get("ready") and "ready_s" not in marks:
                        marks["ready_s"] = now
                    # indexed: all N tools embedded too (BM25 serves them earlier, while the model loads)
                    if (st["index"].get("tools", 0) >= n and st.get("tools", 0) >= n and "indexed_s" not in marks
                            and st["index"].get("degraded") is None):
                        marks["indexed_s"] = now
                time.sleep(POLL_S)
            missing = {"ready_s", "indexed_s", "first_search_s"} - set(marks)
            if missing:
                raise TimeoutError(f"not reached within {timeout} s: {sorted(missing)}; last status index: "
                                   f"{(status or {}).get('index')}")
            res.update({k: round(v, 3) for k, v in marks.items()})
            # Let the last re-list settle, then serve some searches before measuring memory.
            for q in QUERIES * 9:
                try_search(sock, q)
            if latency_queries:
                # Steady state: after the catalog settles the daemon re-runs Rift, counts the
                # catalog's tokens and writes its snapshot; time searches once all are done.
                settled, st = wait_settled(lambda: try_status(sock), RIFT_WAIT_S)
                res["latency_timed_from_s"] = round(time.perf_counter() - t0, 3)
                res["settled_before_latency"] = settled
                res["rift_status_before_latency"] = st.get("rift") or {}
                res["socket_search_latency"] = socket_latency(sock, latency_queries)
            status = try_status(sock) or status
            assert status is not None
            res["memory_mb"] = proc_mem_mb(proc.pid)
            kids = descendants(proc.pid)
            res["upstream_rss_mb"] = round(sum(proc_mem_mb(k).get("VmRSS", 0) for k in kids if alive(k)), 1)
            idx = status["index"]
            res["index"] = {k: idx.get(k) for k in (
                "tools", "mode", "embedder", "degraded", "embeddings_computed", "snapshot_restored", "timings")}
        finally:
            stop(proc)
    return res


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the daemon and wait for its orderly shutdown (30 s), else SIGKILL it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(n: int, embedder: str, restarts: int, timeout: float, n_queries: int = 200) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from tests.support.daemon import Daemon

    upstream = upstream_block(UPSTREAM, n)
    load_start = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="toolatlas-startup-") as tmp_s:
        tmp = Path(tmp_s)
        # Daemon() writes the harness config and links the shared ONNX export into state_dir.
        d = Daemon(tmp, upstream, search_extra=f'embedder = "{embedder}"\n')
        state_files = sorted(str(p.relative_to(tmp)) for p in (tmp / "state").rglob("*")) if (tmp / "state").exists() else []
        cold = one_start(d.config, d.socket, tmp / "cold.log", n, timeout)
        queries = bench_queries(n_queries) if n_queries > 0 else None
        warm = [one_start(d.config, d.socket, tmp / f"warm{i}.log", n, timeout,
                          queries if i == restarts - 1 else None) for i in range(restarts)]

    def med(key: str) -> float:
        return round(median([w[key] for w in warm]), 3)

    return {
        "bench": "startup",
        "catalog": f"{n} tools: ToolLens + MCPToolBench++ replicated (one stdio upstream)",
        "tools": n,
        "embedder": embedder,
        "machine_cores": os.cpu_count(),
        "loadavg_start": load_start,
        "state_dir_before_cold": state_files,
        "cold": cold,
        "warm": warm,
        "socket_search_latency": warm[-1].get("socket_search_latency"),
        "warm_median": {
            "ready_s": med("ready_s"),
            "first_search_s": med("first_search_s"),
            "indexed_s": med("indexed_s"),
            "embeddings_computed_max": max(w["index"]["embeddings_computed"] for w in warm),
            "rss_mb": round(median([w["memory_mb"]["VmRSS"] for w in warm]), 1),
        },
        "goals": {
            "cold_indexed_s <= 60": cold["indexed_s"] <= 60,
            "warm_first_search_s <= 5": med("first_search_s") <= 5,
            "warm_embeddings_computed == 0": all(w["index"]["embeddings_computed"] == 0 for w in warm),
            "rss_mb <= 400": max([cold["memory_mb"]["VmRSS"], *(w["memory_mb"]["VmRSS"] for w in warm)]) <= 400,
            **({"socket_search_miss_p95_ms <= 15": warm[-1]["socket_search_latency"]["miss"]["p95_ms"] <= 15}
               if n_queries > 0 else {}),
        },
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


# -- a client across a daemon restart (issue 16) -------------------------------------------

RESTART_PACE_S = 0.02  # the client's pause between calls (so a refusing shim is not a busy loop)


class _PacedClient:
    """A client calling through `toolatlas shim` in a loop, in a thread: tool_search, then
    execute_tool `alpha__echo`, each answer stamped (time, tool, ok, in-flight error)."""

    def __init__(self, shim_argv: list[str]) -> None:
        self.proc = subprocess.Popen(shim_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)  # its "lost"/"reconnected" lines
        self.answers: list[tuple[float, str, bool, bool]] = []
        self.stop = threading.Event()
        self._id = 0
        self.call("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "bench-restart", "version": "0"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdout is not None
        self._id += 1
        self._send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        while True:  # the shim answers every request (a result or an error): bounded by it
            reply = json.loads(self.proc.stdout.readline() or b"null")
            if reply is None:
                raise ConnectionError("the shim exited")
            if reply.get("id") == self._id:
                return reply

    def _loop(self, deadline_s: float = 3600.0) -> None:
        end = time.monotonic() + deadline_s
        calls = [("tool_search", {"query": "echo a message", "top_k": 3}),
                 ("execute_tool", {"name": "alpha__echo", "arguments": {"message": "hi"}})]
        while not self.stop.is_set() and time.monotonic() < end:
            for tool, args in calls:
                reply = self.call("tools/call", {"name": tool, "arguments": args})
                ok = "result" in reply and not reply["result"].get("isError")
                in_flight = "in flight" in (reply.get("error") or {}).get("message", "")
                self.answers.append((time.monotonic(), tool, ok, in_flight))
                time.sleep(RESTART_PACE_S)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def restart_errors(restarts: int, embedder: str, timeout: float) -> dict[str, Any]:
    """The time a client sees errors across a daemon restart (SIGKILL, then `toolatlas serve`
    started again), through `toolatlas shim`: per restart, from the kill to the first good
    answer after it (per tool), the span from the first error to the first good answer
    after it, and the errors seen; median and p95 over `restarts`."""
    sys.path.insert(0, str(REPO))
    from tests.support.daemon import Daemon, stdio_testserver
    from tests.support.processes import descendants, kill_all

    load_start = [round(x, 2) for x in os.getloadavg()]
    shim = [str(Path(sys.executable).parent / "toolatlas"), "shim"]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="toolatlas-restart-") as tmp_s:
        d = Daemon(Path(tmp_s), stdio_testserver("alpha"), search_extra=f'embedder = "{embedder}"\n')
        with d:
            client = _PacedClient([*shim, "--socket", d.socket])
            client.thread.start()
            try:
                for _ in range(restarts):
                    runs.append(_one_restart(d, client, timeout, descendants, kill_all))
            finally:
                client.close()

    def stat(key: str) -> dict[str, float]:
        xs = [r[key] for r in runs]
        return {"median_s": round(median(xs), 3), "p95_s": round(pct_ms(xs, 95) / 1000, 3), "max_s": round(max(xs), 3)}

    return {
        "bench": "startup_restart",
        "what": "a client through `toolatlas shim` calling tool_search and execute_tool (alpha__echo) in a loop "
                f"({RESTART_PACE_S * 1000:.0f} ms apart) while the daemon is SIGKILLed and started again",
        "restarts": restarts,
        "embedder": embedder,
        "machine_cores": os.cpu_count(),
        "loadavg_start": load_start,
        "kill_to_first_search_ok": stat("kill_to_search_ok_s"),
        "kill_to_first_execute_ok": stat("kill_to_execute_ok_s"),
        "error_window": stat("error_window_s"),
        "daemon_start": stat("daemon_start_s"),
        "kill_to_socket_accepts": stat("kill_to_socket_accepts_s"),
        "socket_accepts_to_first_search_ok": stat("socket_accepts_to_search_ok_s"),
        "errors_per_restart_median": median([r["errors"] for r in runs]),
        "in_flight_errors_total": sum(r["in_flight_errors"] for r in runs),
        "runs": runs,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def _socket_back(path: str, out: list[float], deadline: float) -> None:
    """Append the time `path` first accepts a connection (polled every 10 ms)."""
    import socket

    while time.monotonic() < deadline:
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(path)
            out.append(time.monotonic())
            return
        except OSError:
            time.sleep(0.01)
        finally:
            probe.close()


def _one_restart(d: Any, client: _PacedClient, timeout: float, descendants: Any, kill_all: Any) -> dict[str, Any]:
    """Kill the daemon once the client is served, start it again (from this thread: a daemon
    started from another one dies with it), and wait until the client is served again."""
    def served_since(t: float, tool: str) -> float | None:
        return next((at for at, name, ok, _ in list(client.answers) if at > t and ok and name == tool), None)

    deadline = time.monotonic() + timeout
    mark = time.monotonic()
    while served_since(mark, "execute_tool") is None:
        if time.monotonic() > deadline:
            raise TimeoutError("the client was not served before the kill")
        time.sleep(POLL_S)
    kids = descendants(d.proc.pid)
    t_kill = time.monotonic()
    d.proc.kill()
    d.proc.wait()
    kill_all(kids)
    d.stop()  # closes the log file of the killed daemon
    back: list[float] = []
    probe = threading.Thread(target=_socket_back, args=(d.socket, back, deadline), daemon=True)
    probe.start()
    t0 = time.monotonic()
    d.start(wait_ready=timeout)
    started = time.monotonic() - t0
    probe.join(timeout)
    while served_since(t_kill, "execute_tool") is None or served_since(t_kill, "tool_search") is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the client was not served again within {timeout} s of the kill")
        time.sleep(POLL_S)
    after = [a for a in list(client.answers) if a[0] > t_kill]
    first_error = next((at for at, _, ok, _ in after if not ok), t_kill)
    first_ok = next(at for at, _, ok, _ in after if ok and at > first_error)
    return {
        "kill_to_search_ok_s": round(served_since(t_kill, "tool_search") - t_kill, 3),  # type: ignore[operator]
        "kill_to_execute_ok_s": round(served_since(t_kill, "execute_tool") - t_kill, 3),  # type: ignore[operator]
        "error_window_s": round(first_ok - first_error, 3),
        "daemon_start_s": round(started, 3),
        "kill_to_socket_accepts_s": round(back[0] - t_kill, 3) if back else None,
        # what the shim adds: its reconnect backoff, the replay, one search
        "socket_accepts_to_search_ok_s": round(served_since(t_kill, "tool_search") - back[0], 3) if back else None,  # type: ignore[operator]
        "errors": sum(1 for a in after if not a[2] and a[0] < first_ok),
        "in_flight_errors": sum(1 for a in after if a[3]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tools", type=int, default=2000)
    p.add_argument("--embedder", default="onnx", choices=["onnx", "torch", "none"])
    p.add_argument("--restarts", type=int, default=3, help="warm restarts (median reported)")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per start")
    p.add_argument("--queries", type=int, default=200,
                   help="distinct queries timed end to end over the socket after the last restart (0: skip)")
    p.add_argument("--restart", type=int, default=0, metavar="N",
                   help="instead: the time a client sees errors across N daemon restarts (SIGKILL + start) "
                        "through the shim; writes bench/out/startup_restart.json")
    p.add_argument("--fresh", action="store_true",
                   help="only the fresh-state start (no ONNX export pre-seeded): first correct answer, hybrid")
    p.add_argument("--runs", type=int, default=5, help="--fresh: fresh starts per case (median reported)")
    p.add_argument("--cases", default="example,2000", help="--fresh: example, 2000 or both")
    p.add_argument("--hybrid-runs", type=int, default=None,
                   help="--fresh: how many of the runs also wait for hybrid search (default: all)")
    a = p.parse_args(argv)
    if a.restart:
        emit(restart_errors(a.restart, a.embedder, min(a.timeout, 120)), "startup_restart")
        return 0
    if a.fresh:
        import fresh_start

        emit(fresh_start.run([c for c in a.cases.split(",") if c], max(1, a.runs), a.timeout, a.hybrid_runs),
             "startup_fresh")
        return 0
    emit(run(a.tools, a.embedder, max(1, a.restarts), a.timeout, a.queries), "startup")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
