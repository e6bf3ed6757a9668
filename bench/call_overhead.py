"""execute_tool through the gateway vs a direct warm SDK session vs a fresh session per call.

    .venv/bin/python bench/call_overhead.py [--calls 200] [--oneshot-calls 200]

Upstream: the project's test server over stdio (`echo`). Every path uses the same MCP SDK
client, so the difference is the gateway: socket hop, routing, the warm upstream session.
Prints JSON; the goal is gateway_overhead_ms (median socket - median direct) <= 1.5.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from _common import Daemon, emit, stdio_testserver, summary
from tests.support.servers import testserver_args
from toolatlas.surface.unix import unix_client

UPSTREAM = StdioServerParameters(command=sys.executable, args=testserver_args())


async def timed_calls(client: Client, n: int, name: str, args: dict) -> list[float]:
    for _ in range(10):  # warm-up
        await client.call_tool(name, args)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await client.call_tool(name, args)
        out.append(time.perf_counter() - t0)
        assert not r.is_error, r
    return out


async def run(calls: int, oneshot_calls: int, sock: str) -> dict:
    via = {"name": "bench__echo", "arguments": {"message": "hi"}}
    async with Client(UPSTREAM) as direct:
        direct_s = await timed_calls(direct, calls, "echo", {"message": "hi"})
    async with Client(unix_client(sock)) as gw:
        socket_s = await timed_calls(gw, calls, "execute_tool", via)
    shim = StdioServerParameters(command=sys.executable, args=["-m", "toolatlas", "shim", "--socket", sock])
    async with Client(shim) as gw:
        shim_s = await timed_calls(gw, calls, "execute_tool", via)
    oneshot_s = []
    for _ in range(oneshot_calls):
        t0 = time.perf_counter()
        async with Client(UPSTREAM) as fresh:
            r = await fresh.call_tool("echo", {"message": "hi"})
        oneshot_s.append(time.perf_counter() - t0)
        assert not r.is_error
    d, s, h, o = summary(direct_s), summary(socket_s), summary(shim_s), summary(oneshot_s)
    return {
        "bench": "call_overhead",
        "upstream": "tests/support/servers/testserver.py over stdio, tool echo",
        "calls": calls,
        "direct_warm": d,
        "gateway_socket": s,
        "gateway_shim": h,
        "oneshot_fresh_session": o,
        "gateway_overhead_ms": round(s["median_ms"] - d["median_ms"], 3),
        "gateway_shim_overhead_ms": round(h["median_ms"] - d["median_ms"], 3),
        "oneshot_over_gateway_ratio": round(o["median_ms"] / s["median_ms"], 1),
        "goal": "gateway_overhead_ms <= 1.5",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--oneshot-calls", type=int, default=200)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Daemon(Path(tmp), stdio_testserver("bench")) as d:
        result = anyio.run(run, a.calls, a.oneshot_calls, d.socket)
    emit(result, "call_overhead")


if __name__ == "__main__":
    main()
