"""A configurable MCP server for the test suite (all transports).

    python tests/support/servers/testserver.py [--transport stdio|sse|http] [--port 0]
        [--tools N] [--page-size N] [--resources N] [--name NAME]

Tools: ``echo``, ``sleep(seconds)``, ``hang`` (never returns), ``crash`` (the process exits
at once), ``add_tool(name, description)`` / ``remove_tool(name)`` (change the catalog and
announce it on both protocol generations: the legacy notification on the calling session
and a ``subscriptions/listen`` event; ``announce=false`` changes it silently), ``progress(steps)`` (progress notifications),
``pid`` (the process its client started: PROCESS_ID), plus ``--tools N`` generated ``gen_NNN`` tools, and with
``--blob`` ``blob(size, stream)`` (a result of ``size`` bytes of text; with ``stream``, after a
notification).
``--start-delay-file F`` waits the seconds F holds, if it exists, before serving (a slow start).
``--page-size N`` makes tools/list (and resources/list) return N items a page with a ``nextCursor``.
``--resources N`` adds N text resources ``test://res/NNN`` (text ``resource NNN``), a
template ``test://item/{id}``, a prompt ``greet(name)``, a resource ``shared://same`` every
such server lists (for URI collisions), and the tools ``add_resource(name)`` (adds
``test://res/<name>`` and announces the change on both protocol generations),
``log_at(levels)`` (a log message at each level) and ``link(name)`` (a result holding a
resource_link to ``test://item/<name>``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resources.types import TextResource
from mcp_types import ListResourcesResult, ListToolsResult, PaginatedRequestParams, ResourceLink, TextContent
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel

from toolatlas.examples import _serve

# The process this server's client started and signals, as `pid` reports it: this one, or its
# launcher when the suite's fork server (forkserver.py) runs it.
PROCESS_ID: int | None = None


class PagedServer(MCPServer):
    """MCPServer whose tools/list and resources/list page by ``page_size`` (0 = one page) with
    offset cursors."""

    page_size = 0

    def _page(self, items: list[Any], params: PaginatedRequestParams | None) -> tuple[list[Any], str | None]:
        if self.page_size <= 0:
            return items, None
        cursor = params.cursor if params is not None else None
        start = int(cursor) if cursor and cursor.isdigit() else 0
        end = start + self.page_size
        return items[start:end], str(end) if end < len(items) else None

    async def _handle_list_tools(self, ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        tools, nxt = self._page(await self.list_tools(), params)
        return ListToolsResult(tools=tools, next_cursor=nxt)

    async def _handle_list_resources(self, ctx: Any, params: PaginatedRequestParams | None) -> ListResourcesResult:
        resources, nxt = self._page(await self.list_resources(), params)
        return ListResourcesResult(resources=resources, next_cursor=nxt)


async def _announce(ctx: Context) -> None:
    # Legacy (<= 2025-11-25): a notification on the calling session.
    with contextlib.suppress(Exception):
        await ctx.request_context.session.send_tool_list_changed()
    # 2026-07-28: an event for every open subscriptions/listen stream.
    with contextlib.suppress(Exception):
        await ctx.notify_tools_changed()


class _Name(BaseModel):
    name: str


def ask_name() -> Elicit[_Name]:
    """Resolver for greet_user: elicit the user's name (input_required on 2026-07-28)."""
    return Elicit("What is your name?", _Name)


def _add_resources(server: PagedServer, count: int) -> None:
    for i in range(count):
        server.add_resource(TextResource(uri=f"test://res/{i:03d}", name=f"res-{i:03d}", text=f"resource {i:03d}"))
    server.add_resource(TextResource(uri="shared://same", name="shared", text=f"shared resource of {server.name}"))

    @server.resource("test://item/{id}", name="item", description="An item by id.")
    def item(id: str) -> str:
        return f"item {id} of {server.name}"

    @server.prompt(description="Greet someone by name.")
    def greet(name: str) -> str:
        return f"Please greet {name} warmly."

    @server.tool(description="Add the resource test://res/<name> and announce the change.")
    async def add_resource(name: str, ctx: Context) -> str:
        server.add_resource(TextResource(uri=f"test://res/{name}", name=name, text=f"added {name}"))
        with contextlib.suppress(Exception):
            await ctx.request_context.session.send_resource_list_changed()
        with contextlib.suppress(Exception):
            await ctx.notify_resources_changed()
        return f"added test://res/{name}"

    @server.tool(description="Send one log message at each of `levels` (logger 'test'), then return.")
    async def log_at(levels: list[str], ctx: Context) -> str:
        with warnings.catch_warnings():  # logging is deprecated in 2026-07-28; it is what is tested
            warnings.simplefilter("ignore")
            for level in levels:
                await ctx.log(level, f"{level} message", logger_name="test")  # type: ignore[arg-type]
        return f"logged {len(levels)}"

    @server.tool(description="Return a resource_link to test://item/<name>.")
    def link(name: str) -> list[Any]:
        return [TextContent(type="text", text="here is the item"),
                ResourceLink(type="resource_link", uri=f"test://item/{name}", name=name)]


def build(name: str = "testserver", tools: int = 0, page_size: int = 0, echo_description: str | None = None,
          with_blob: bool = False, resources: int = 0) -> PagedServer:
    server = PagedServer(name, instructions="A configurable server for toolatlas tests.")
    server.page_size = page_size

    @server.tool(description=echo_description or "Echo the message back, prefixed with 'Echo: '.")
    def echo(message: str) -> str:
        return f"Echo: {message}"

    @server.tool(description="Wait the given number of seconds, then return how long it slept.")
    async def sleep(seconds: float) -> str:
        await anyio.sleep(seconds)
        return f"slept {seconds:g} s"

    @server.tool(description="Never return (for timeout tests).")
    async def hang() -> str:
        await anyio.sleep_forever()
        return "unreachable"

    @server.tool(description="Exit the server process immediately with the given code.")
    def crash(code: int = 1) -> str:
        sys.stderr.write(f"testserver: crashing with code {code}\n")
        sys.stderr.flush()
        os._exit(code)

    @server.tool(description="Ask the user for their name (an elicitation), then greet them by it.")
    async def greet_user(who: Annotated[_Name, Resolve(ask_name)]) -> str:
        return f"Hello, {who.name}! (pid {PROCESS_ID or os.getpid()})"

    @server.tool(description="Return this server's process id.")
    def pid() -> int:
        return PROCESS_ID or os.getpid()

    @server.tool(description="Send `steps` progress notifications (`interval` seconds apart), then return 'done'.")
    async def progress(steps: int, ctx: Context, interval: float = 0.0) -> str:
        for i in range(1, steps + 1):
            if interval:
                await anyio.sleep(interval)
            await ctx.report_progress(i, steps, f"step {i}")
        return "done"

    @server.tool(description="Add a tool with this name and description at run time and announce the change "
                 "(unless `announce` is false: a server that changes silently).")
    async def add_tool(name: str, description: str, ctx: Context, announce: bool = True) -> str:
        def dynamic(text: str = "") -> str:
            return f"{name}: {text}"

        server.add_tool(dynamic, name=name, description=description)
        if announce:
            await _announce(ctx)
        return f"added {name}"

    @server.tool(description="Remove a tool by name at run time and announce the change (unless `announce` is false).")
    async def remove_tool(name: str, ctx: Context, announce: bool = True) -> str:
        server.remove_tool(name)
        if announce:
            await _announce(ctx)
        return f"removed {name}"

    def make_gen(i: int) -> Any:
        def gen(value: str = "") -> str:
            return f"gen_{i:03d}: {value}"

        return gen

    if with_blob:
        @server.tool(description="Return `size` bytes of text (for result size limits); with `stream`, a log "
                     "notification first (over streamable HTTP the reply is then an event stream, not JSON).")
        async def blob(size: int, ctx: Context, stream: bool = False) -> str:
            if stream:
                await ctx.info("blob: streaming")
            return "x" * size

    if tools:
        # The generated tools share one signature: build the first with add_tool and copy it for
        # the rest (add_tool builds a pydantic model per function: ~20 s for 2,000 tools on a
        # loaded host, which made a 2,000-tool fresh start a measure of this server, not of toolatlas).
        manager = server._tool_manager  # the SDK's own registry; a test server may reach in
        first = manager.add_tool(make_gen(0), name="gen_000", description="Generated test tool number 0; returns its input.")
        registry = manager._tools
        for i in range(1, tools):
            registry[f"gen_{i:03d}"] = first.model_copy(update={
                "fn": make_gen(i), "name": f"gen_{i:03d}",
                "description": f"Generated test tool number {i}; returns its input."})
    if resources:
        _add_resources(server, resources)
    return server


def main(argv: Sequence[str] | None = None) -> None:
    p = _serve.parser("Configurable MCP test server.")
    p.add_argument("--name", default="testserver")
    p.add_argument("--tools", type=int, default=0, help="extra generated tools")
    p.add_argument("--page-size", type=int, default=0, help="tools per tools/list page (0 = all)")
    p.add_argument("--blob", action="store_true", help="add the blob tool (big results)")
    p.add_argument("--resources", type=int, default=0, help="N resources, a template, a prompt (see the docstring)")
    p.add_argument("--echo-description-file", help="if this file exists at start, echo's description is its text "
                   "(a new release of the server that redefines a tool)")
    p.add_argument("--start-delay-file", help="if this file exists at start, wait the seconds it holds before "
                   "serving (a server slow to start, with the same command line)")
    args = p.parse_args(argv)
    if args.start_delay_file and os.path.exists(args.start_delay_file):
        with open(args.start_delay_file, encoding="utf-8") as fh:
            time.sleep(float(fh.read()))
    echo_description = None
    if args.echo_description_file and os.path.exists(args.echo_description_file):
        with open(args.echo_description_file, encoding="utf-8") as fh:
            echo_description = fh.read().strip()
    _serve.run(build(args.name, args.tools, args.page_size, echo_description, args.blob, args.resources), args)


if __name__ == "__main__":
    main()
