"""toolatlas beside a FastMCP 4 proxy of the same upstreams, in one run, interleaved.

    .venv/bin/python bench/peers.py [--tools 2000] [--calls 200] [--queries 100]
        [--embedder onnx|none] [--venv DIR]

FastMCP is never a dependency of toolatlas: the script makes its own virtualenv (default
`bench/out/peers-venv`, git-ignored) and installs `fastmcp>=4,<5` into it from PyPI with pip
(network access needed once; later runs reuse it). When that fails the script prints JSON
with `error` saying so and exits 2.

Upstreams (the same processes' code for both sides): the project's test server (`echo`)
and `catalog_upstream.py` with `--tools` tools, over stdio. toolatlas: a real
`toolatlas serve` federating both (default hybrid ranker, ONNX embedder with the
machine's export). FastMCP: `create_proxy` of an MCPConfig naming both, with
`BM25SearchTransform` (its clients see `search_tools` and `call_tool`), served over stdio
from the other virtualenv; the proxy is given a connected FastMCP `Client`, so it keeps one
warm session per upstream (given the bare config, FastMCP opens a new upstream session for
every request: seconds per call here). Clients: the MCP SDK's `Client` of this tree for every path.

* calls: each round, in shuffled order, `echo` on a direct warm session, `execute_tool`
  through the toolatlas socket, the proxied tool called by its name through FastMCP, and
  FastMCP's `call_tool`; overhead = median of the per-round differences to the direct call.
* search: each query (distinct ToolLens / MCPToolBench++ queries) to toolatlas'
  `tool_search` and FastMCP's `search_tools`, alternating which goes first.

Prints JSON (also bench/out/peers.json) with medians, p95s and the ratios FastMCP/toolatlas
(search p50 and execute overhead; the issue's goals: >= 40x and >= 5x).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from _common import OUT, REPO, Daemon, emit, pct_ms, stdio_testserver, wait_settled
from tests.support.servers import testserver_args
from toolatlas.surface.unix import unix_client

FASTMCP_SPEC = "fastmcp>=4,<5"
PROXY = '''
import json, sys
import anyio
from fastmcp import Client
from fastmcp.server import create_proxy
from fastmcp.server.transforms.search.bm25 import BM25SearchTransform


async def main() -> None:
    # A connected client: the proxy shares its warm upstream sessions (given the config
    # itself, FastMCP opens a fresh session to the upstream for every request).
    async with Client(json.loads(open(sys.argv[1]).read())) as client:
        proxy = create_proxy(client)
        proxy.add_transform(BM25SearchTransform(max_results=5))
        await proxy.run_async("stdio", show_banner=False)


anyio.run(main)
'''


def venv_python(venv: Path) -> tuple[Path | None, str]:
    """The venv's python with FastMCP installed (made if missing), or None and why not."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import fastmcp, sys; print(fastmcp.__version__)"]
    if py.exists():
        got = subprocess.run(probe, capture_output=True, text=True)
        if got.returncode == 0:
            return py, got.stdout.strip()
    steps = [[sys.executable, "-m", "venv", str(venv)], [str(py), "-m", "pip", "install", "-q", FASTMCP_SPEC]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return None, f"{' '.join(step[:4])} failed: {' / '.join(tail)}"
    got = subprocess.run(probe, capture_output=True, text=True)
    return (py, got.stdout.strip()) if got.returncode == 0 else (None, got.stderr.strip()[-300:])


def stats(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "median_ms": pct_ms(samples, 50), "p95_ms": pct_ms(samples, 95)}


def _text(result: Any) -> str:
    return "".join(getattr(b, "text", "") for b in result.content)


async def run(sock: str, fast: StdioServerParameters, calls: int, queries: list[str]) -> dict[str, Any]:
    direct_up = StdioServerParameters(command=sys.executable, args=testserver_args())
    times: dict[str, list[float]] = {}
    async with Client(direct_up) as direct, Client(unix_client(sock)) as atlas, Client(fast) as fm:
        listed = {t.name for t in (await fm.list_tools()).tools}
        found = await fm.call_tool("search_tools", {"query": "echo the message back"})
        echo_name = next((n for n in ("bench_echo", "echo", "bench__echo") if n in _text(found)), "bench_echo")
        paths = {
            "direct": (direct, "echo", {"message": "hi"}),
            "toolatlas_execute": (atlas, "execute_tool", {"name": "bench__echo", "arguments": {"message": "hi"}}),
            "fastmcp_proxied_tool": (fm, echo_name, {"message": "hi"}),
            "fastmcp_call_tool": (fm, "call_tool", {"name": echo_name, "arguments": {"message": "hi"}}),
        }
        for client, name, args in paths.values():  # warm-up, and every path must work
            for _ in range(5):
                res = await client.call_tool(name, args)
            if res.is_error or "Echo: hi" not in _text(res):
                raise RuntimeError(f"{name} did not echo: {res}")
        print(f"peers: calls ({calls} rounds)", file=sys.stderr, flush=True)
        times = {k: [] for k in paths}
        order, rng = list(paths), random.Random(1)
        for _ in range(calls):
            rng.shuffle(order)
            for k in order:
                client, name, args = paths[k]
                t0 = time.perf_counter()
                await client.call_tool(name, args)
                times[k].append(time.perf_counter() - t0)
        print(f"peers: search ({len(queries)} queries)", file=sys.stderr, flush=True)
        search: dict[str, list[float]] = {"toolatlas_tool_search": [], "fastmcp_search_tools": []}
        for i, q in enumerate(queries):
            pair = [("toolatlas_tool_search", atlas, "tool_search", {"query": q, "top_k": 5}),
                    ("fastmcp_search_tools", fm, "search_tools", {"query": q})]
            for key, client, name, args in (pair if i % 2 == 0 else pair[::-1]):
                t0 = time.perf_counter()
                res = await client.call_tool(name, args)
                search[key].append(time.perf_counter() - t0)
                if res.is_error:
                    raise RuntimeError(f"{name} failed: {_text(res)[:300]}")
    out: dict[str, Any] = {k: stats(v) for k, v in {**times, **search}.items()}
    d = times["direct"]
    over = {k: pct_ms([x - y for x, y in zip(times[k], d)], 50)
            for k in ("toolatlas_execute", "fastmcp_proxied_tool", "fastmcp_call_tool")}
    out["overhead_over_direct_ms"] = over
    a = out["toolatlas_tool_search"]["median_ms"]
    out["ratios_fastmcp_over_toolatlas"] = {
        "search_p50": round(out["fastmcp_search_tools"]["median_ms"] / a, 1) if a else None,
        "execute_overhead_proxied_tool": round(over["fastmcp_proxied_tool"] / over["toolatlas_execute"], 2)
        if over["toolatlas_execute"] > 0 else None,
        "execute_overhead_call_tool": round(over["fastmcp_call_tool"] / over["toolatlas_execute"], 2)
        if over["toolatlas_execute"] > 0 else None,
    }
    out["fastmcp_tools_listed"] = sorted(listed)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tools", type=int, default=2000)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--embedder", default="onnx", choices=["onnx", "none"])
    p.add_argument("--venv", default=str(OUT / "peers-venv"))
    a = p.parse_args()
    out: dict[str, Any] = {"bench": "peers", "tools": a.tools, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]}
    py, version = venv_python(Path(a.venv))
    if py is None:
        out["error"] = f"FastMCP could not be installed into {a.venv}: {version}"
        emit(out, "peers")
        return 2
    out["fastmcp_version"] = version
    sys.path.insert(0, str(REPO / "bench"))
    from catalog_upstream import upstream_block
    from search_latency import bench_queries

    catalog = upstream_block("catalog", a.tools, 0, 1, "relist_interval = 0\n")
    with tempfile.TemporaryDirectory() as tmp:
        cat_args = json.loads(catalog.split("args = ", 1)[1].splitlines()[0])
        config = {"mcpServers": {
            "bench": {"command": sys.executable, "args": testserver_args()},
            "catalog": {"command": sys.executable, "args": cat_args},
        }}
        (Path(tmp) / "proxy.py").write_text(PROXY)
        (Path(tmp) / "proxy.json").write_text(json.dumps(config))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        fast = StdioServerParameters(command=str(py), args=[str(Path(tmp) / "proxy.py"), str(Path(tmp) / "proxy.json")],
                                     env=env)
        (Path(tmp) / "atlas").mkdir()
        with Daemon(Path(tmp) / "atlas", stdio_testserver("bench") + catalog,
                    search_extra=f'embedder = "{a.embedder}"\n') as d:
            print("peers: waiting for toolatlas to index the catalog", file=sys.stderr, flush=True)
            d.wait_for(lambda: d.status()["index"]["tools"] >= a.tools, timeout=3600, what="catalog indexed")
            wait_settled(d.status, 600)
            out.update(anyio.run(run, d.socket, fast, a.calls, bench_queries(a.queries)))
    out["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    emit(out, "peers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
