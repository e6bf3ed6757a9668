"""A misbehaving MCP server for fault-injection tests (all transports).

    python tests/support/servers/faultserver.py [--transport stdio|sse|http] [--port 0]
        [--fault FAULT] [--fault-file PATH] [--delay S] [--size BYTES]

The current fault applies to every *work* tool (``echo``, ``work``); the control tools
(``set_fault``, ``heal``, ``stats``) always answer, unless the fault makes the whole
server unreachable (``http500``). Faults:

- ``none``     healthy;
- ``crash``    a work call exits the process at once (code 3);
- ``hang``     a work call never returns;
- ``slow``     a work call first sleeps ``delay`` seconds;
- ``garbage``  a work call first writes non-JSON lines on stdout (stdio only), then answers;
- ``huge``     ``echo`` returns a text of ``size`` bytes (default 50 MB);
- ``http500``  every HTTP request gets ``503`` (sse/http; a small ASGI middleware);
- ``stale``    (http) every session that exists when the fault is set gets ``404`` from then
  on, like a server that restarted and forgot its sessions; new sessions work. Sessions
  exist on the 2025 protocol only: start with ``--legacy-only`` (``server/discover`` gets an
  HTTP 400, so an ``auto`` client falls back to the initialize handshake).

With ``--fault-file PATH`` the fault lives in that JSON file (``{"fault": ..., "delay": ...,
"size": ...}``), re-read whenever it changes: it survives a restart of the server (a
``crash`` fault keeps crashing the restarted process until healed), and a test can heal a
server it cannot reach by rewriting the file. ``heal`` sets ``none``.

Other tools: ``work(seconds)`` sleeps and counts concurrent calls; ``stats`` returns
``{"pid", "calls", "inflight", "max_inflight", "cancelled", "completed", "garbage"}`` (``cancelled``
counts work handlers cancelled by the client, i.e. by ``notifications/cancelled``);
``reset_stats``; ``storm(count, per_second)`` sends ``count`` tools/list_changed
notifications at that rate on the calling session, then returns how many it sent.

Refusing connections is not a mode of a running server: point an upstream at a port where
nothing listens (or stop the server), then start one there with ``--port N``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

from toolatlas.examples import _serve

# The process this server's client started and signals, as `stats` reports it: this one, or its
# launcher when the suite's fork server (forkserver.py) runs it.
PROCESS_ID: int | None = None

FAULTS = ("none", "crash", "hang", "slow", "garbage", "huge", "http500", "stale")
DEFAULT_SIZE = 50 * 1024 * 1024


class FaultState:
    """The active fault, in memory or in a JSON file shared across restarts."""

    def __init__(self, fault: str, delay: float, size: int, path: str | None) -> None:
        self.path = path
        self.fault, self.delay, self.size = fault, delay, size
        self._mtime: int | None = None
        if path is not None:
            if os.path.exists(path):
                self._read()
            else:
                self.set(fault, delay, size)

    def _read(self) -> None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
            if st.st_mtime_ns == self._mtime:
                return
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return  # a half-written file: keep the last good state
        self._mtime = st.st_mtime_ns
        self.fault = data.get("fault", "none")
        self.delay = float(data.get("delay", self.delay))
        self.size = int(data.get("size", self.size))

    def current(self) -> str:
        if self.path is not None:
            self._read()
        return self.fault

    def set(self, fault: str, delay: float | None = None, size: int | None = None) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        self.fault = fault
        if delay is not None:
            self.delay = delay
        if size is not None:
            self.size = size
        if self.path is not None:
            write_fault_file(self.path, fault, self.delay, self.size)
            self._mtime = os.stat(self.path).st_mtime_ns


def write_fault_file(path: str, fault: str, delay: float = 2.0, size: int = DEFAULT_SIZE) -> None:
    """Atomically set the fault of every faultserver started with ``--fault-file path``."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"fault": fault, "delay": delay, "size": size}, fh)
    os.replace(tmp, path)


class Stats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = self.inflight = self.max_inflight = self.cancelled = self.completed = self.garbage = 0

    def as_dict(self) -> dict[str, int]:
        return {"pid": PROCESS_ID or os.getpid(), "calls": self.calls, "inflight": self.inflight,
                "max_inflight": self.max_inflight, "cancelled": self.cancelled, "completed": self.completed,
                "garbage": self.garbage}


class FaultMiddleware:
    """ASGI middleware in front of the MCP app: 503 on ``http500``, 404 for stale sessions."""

    def __init__(self, app: Any, state: FaultState, legacy_only: bool = False) -> None:
        self.app = app
        self.state = state
        self.legacy_only = legacy_only
        self.known: set[str] = set()
        self.stale: set[str] = set()

    def mark_stale(self) -> None:
        self.stale |= self.known

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        fault = self.state.current()
        if fault == "http500":
            await _plain(send, 503, b"injected fault: service unavailable")
            return
        headers = dict(scope.get("headers") or [])
        sid = headers.get(b"mcp-session-id", b"").decode()
        if sid and sid in self.stale:
            await _plain(send, 404, b"session not found")
            return

        if self.legacy_only and scope.get("method") == "POST":
            body, receive = await _buffer(receive)
            if b'"server/discover"' in body:
                # An HTTP-layer refusal: the SDK's auto mode falls back to the initialize
                # handshake, i.e. to sessions with an Mcp-Session-Id (which `stale` needs).
                await _plain(send, 400, b"server/discover is not supported here")
                return

        async def remember(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                for k, v in message.get("headers") or []:
                    if k.lower() == b"mcp-session-id":
                        self.known.add(v.decode())
            await send(message)

        await self.app(scope, receive, remember)


async def _buffer(receive: Any) -> tuple[bytes, Any]:
    """Read the whole request body; return it and a `receive` that replays it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


async def _plain(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class FaultServer(MCPServer):
    middleware: FaultMiddleware | None = None
    state: FaultState
    legacy_only = False

    def streamable_http_app(self, **kw: Any) -> Any:  # type: ignore[override]
        self.middleware = FaultMiddleware(super().streamable_http_app(**kw), self.state, self.legacy_only)
        return self.middleware

    def sse_app(self, **kw: Any) -> Any:  # type: ignore[override]
        self.middleware = FaultMiddleware(super().sse_app(**kw), self.state, self.legacy_only)
        return self.middleware


def build(state: FaultState, name: str = "faultserver", legacy_only: bool = False) -> FaultServer:
    server = FaultServer(name, instructions="A misbehaving server for toolatlas fault tests.")
    server.state = state
    server.legacy_only = legacy_only
    stats = Stats()

    async def apply_fault() -> str:
        fault = state.current()
        if fault == "crash":
            sys.stderr.write("faultserver: injected crash\n")
            sys.stderr.flush()
            os._exit(3)
        if fault == "hang":
            await anyio.sleep_forever()
        if fault == "slow":
            await anyio.sleep(state.delay)
        if fault == "garbage":
            # Straight onto fd 1, between two JSON-RPC messages of the SDK's writer.
            os.write(1, b"this is not JSON-RPC\n{\"broken\": \n\x00\xff\xfe garbage\n")
            stats.garbage += 1
        return fault

    @server.tool(description="Echo the message back, prefixed with 'Echo: ' (subject to the active fault).")
    async def echo(message: str) -> str:
        stats.calls += 1
        fault = await apply_fault()
        if fault == "huge":
            return "x" * state.size
        return f"Echo: {message}"

    @server.tool(description="Sleep `seconds` (subject to the active fault); counts concurrent and cancelled calls.")
    async def work(seconds: float) -> str:
        stats.calls += 1
        stats.inflight += 1
        stats.max_inflight = max(stats.max_inflight, stats.inflight)
        try:
            await apply_fault()
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            stats.cancelled += 1
            raise
        finally:
            stats.inflight -= 1
        stats.completed += 1
        return f"worked {seconds:g} s"

    @server.tool(description="Set the active fault: " + ", ".join(FAULTS) + ".")
    async def set_fault(fault: str, delay: float | None = None, size: int | None = None) -> str:
        state.set(fault, delay, size)
        if fault == "stale" and server.middleware is not None:
            server.middleware.mark_stale()
        return f"fault {fault}"

    @server.tool(description="Stop the active fault (same as set_fault('none')).")
    def heal() -> str:
        state.set("none")
        return "healed"

    @server.tool(description="Counters of this process: calls, inflight, max_inflight, cancelled, completed, pid.")
    def stats_tool() -> dict[str, int]:
        return stats.as_dict()

    @server.tool(description="Reset the counters.")
    def reset_stats() -> str:
        stats.reset()
        return "reset"

    @server.tool(description="Send `count` tools/list_changed notifications at `per_second` on this session.")
    async def storm(count: int, per_second: float, ctx: Context) -> int:
        sent = 0
        gap = 1.0 / per_second if per_second > 0 else 0.0
        for _ in range(count):
            with contextlib.suppress(Exception):
                await ctx.request_context.session.send_tool_list_changed()
                sent += 1
            if gap:
                await anyio.sleep(gap)
        return sent

    # The registered name is `stats`; the function is named otherwise to keep `stats` the object.
    server.remove_tool("stats_tool")
    server.add_tool(stats_tool, name="stats", description="Counters of this process: calls, inflight, "
                    "max_inflight, cancelled, completed, pid.")
    return server


def main(argv: Sequence[str] | None = None) -> None:
    p = _serve.parser("Fault-injecting MCP test server.")
    p.add_argument("--name", default="faultserver")
    p.add_argument("--fault", default="none", choices=FAULTS)
    p.add_argument("--fault-file", help="JSON file holding the fault (shared across restarts)")
    p.add_argument("--delay", type=float, default=2.0, help="seconds for the slow fault")
    p.add_argument("--size", type=int, default=DEFAULT_SIZE, help="bytes for the huge fault")
    p.add_argument("--legacy-only", action="store_true",
                   help="(http) refuse server/discover so clients use initialize and session ids")
    args = p.parse_args(argv)
    state = FaultState(args.fault, args.delay, args.size, args.fault_file)
    _serve.run(build(state, args.name, args.legacy_only), args)


if __name__ == "__main__":
    main()
