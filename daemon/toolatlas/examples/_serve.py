"""Shared command line and serving for the example servers.

    python -m toolatlas.examples.<name> [--transport stdio|sse|http] [--host H] [--port N]

For sse/http the socket is bound before the server starts (``--port 0`` picks a free
port), and ``READY <port>`` is printed on stdout once the server accepts connections, so
scripts and tests can wait on it instead of sleeping.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import anyio

from mcp.server.mcpserver import MCPServer

TRANSPORTS = ("stdio", "sse", "http")


def parser(description: str, default_transport: str = "stdio", default_port: int = 0) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--transport", choices=TRANSPORTS, default=default_transport)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=default_port, help="0 picks a free port (printed as READY <port>)")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(server: MCPServer, transport: str, host: str, port: int, log_level: str = "WARNING") -> None:
    """Serve ``server`` until cancelled or signalled."""
    if transport == "stdio":
        await server.run_stdio_async()
        return
    import uvicorn

    if transport == "sse":
        app = server.sse_app(host=host)
    else:
        app = server.streamable_http_app(host=host)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=log_level.lower(), lifespan="on", timeout_graceful_shutdown=2)
    srv = uvicorn.Server(config)

    async def announce() -> None:
        while not srv.started:
            await anyio.sleep(0.01)
        print(f"READY {bound}", flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await srv.serve(sockets=[sock])
        tg.cancel_scope.cancel()


def run(server: MCPServer, args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    # MCPServer configures its own logging at INFO; the examples stay quiet by default.
    logging.getLogger("mcp").setLevel(args.log_level)
    try:
        anyio.run(serve, server, args.transport, args.host, args.port, args.log_level)
    except KeyboardInterrupt:
        pass
