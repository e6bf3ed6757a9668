"""MCP wiring: one low-level `Server` whose handlers answer for the Gateway.

Each client connection carries a `Connection` in a contextvar (set by the accept loop before
the transport starts, and carried to handlers by the SDK's context streams), so handlers know
who is asking (peer credentials, client name) without trusting the request.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.subscriptions import ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError

from toolatlas import __version__
from toolatlas.errors import BadInput, ToolatlasError, UpstreamTimeout, UpstreamUnavailable
from toolatlas.surface.meta_tools import CATALOG_STATUS, EXECUTE_TOOL, META_TOOLS, TOOL_SEARCH, clamp_top_k

if TYPE_CHECKING:
    from toolatlas.app import Gateway

log = logging.getLogger(__name__)

INVALID_PARAMS = -32602
CLIENT_INFO_META_KEY = "io.modelcontextprotocol/clientInfo"


@dataclass(eq=False)
class Connection:
    """One client connection: who it is (from the kernel, not the client) and its session."""

    id: int
    pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    token: str | None = None  # the name of the HTTP bearer token that authenticated it
    client_name: str | None = None
    session: Any = None  # the SDK ServerSession last seen on this connection
    saw_passthrough: bool | None = None  # what its last tools/list returned
    extra: dict[str, Any] = field(default_factory=dict)


CONNECTION: ContextVar[Connection | None] = ContextVar("toolatlas_connection", default=None)


def _client_name(ctx: Any) -> str | None:
    params = getattr(ctx.session, "client_params", None)
    if params is not None and getattr(params, "client_info", None) is not None:
        return params.client_info.name
    meta = ctx.meta
    info = None
    if meta is not None:
        info = meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, dict) else getattr(meta, "model_extra", {}).get(CLIENT_INFO_META_KEY)
    if isinstance(info, dict):
        return info.get("name")
    return None


def _connection(ctx: Any) -> Connection:
    conn = CONNECTION.get()
    if conn is None:  # in-process use (tests, tools): an anonymous local connection
        conn = Connection(id=0)
    conn.session = ctx.session
    name = _client_name(ctx)
    if name:
        conn.client_name = name
    return conn


def _input_retry(ctx: Any, params: types.CallToolRequestParams) -> Any:
    """The input_required fields of a 2026-07-28 call (None on older connections, whose
    clients cannot answer an input_required result)."""
    from toolatlas.app import InputRetry

    if ctx.session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return None
    return InputRetry(input_responses=params.input_responses, request_state=params.request_state)


def json_result(obj: Any, *, is_error: bool = False) -> types.CallToolResult:
    """A meta-tool result: the JSON as text content and as structuredContent."""
    text = json.dumps(obj, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=obj if isinstance(obj, dict) else None,
        is_error=is_error,
    )


def error_result(message: str) -> types.CallToolResult:
    """An isError result a model can read and act on."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def _tool(defn: dict[str, Any]) -> types.Tool:
    return types.Tool(name=defn["name"], description=defn["description"], input_schema=defn["inputSchema"])


_META = [_tool(t) for t in META_TOOLS]


class ConnectionBus:
    """The `subscriptions/listen` fan-out (2026-07-28) with the gateway's own rule: a
    listener hears `tools/list_changed` only when the list *its* connection sees changed
    (passthrough views), never for the three meta-tools, which do not change."""

    def __init__(self, wants: Any) -> None:
        self._wants = wants  # (Connection) -> bool: does this connection's list change now?
        self._listeners: dict[object, tuple[Connection | None, Any]] = {}

    async def publish(self, event: Any) -> None:
        for conn, listener in list(self._listeners.values()):
            if conn is not None and not self._wants(conn):
                continue
            try:
                listener(event)
            except Exception:  # one bad listener must not starve the others
                log.exception("subscription listener raised; continuing")

    def subscribe(self, listener: Any) -> Any:
        token = object()
        # Runs inside the listen request's handler: the connection's context is current.
        self._listeners[token] = (CONNECTION.get(), listener)
        return lambda: self._listeners.pop(token, None)

    async def tools_changed(self) -> None:
        await self.publish(ToolsListChanged())


def build_server(gw: "Gateway") -> Server[Any]:
    """The MCP server every connection (socket, shim) is served by."""

    async def on_list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        conn = _connection(ctx)
        passthrough = gw.passthrough_for(conn)
        conn.saw_passthrough = passthrough
        if not passthrough:
            tools = _META
        else:
            tools = [
                types.Tool(
                    name=r.name,
                    title=r.title,
                    description=r.description,
                    input_schema=r.input_schema,
                    output_schema=r.output_schema,
                )
                for r in gw.visible_records(conn)
            ]
        gw.events_emit("tools_list_served", passthrough=passthrough, tools=len(tools), client=conn.client_name)
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(
        ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        conn = _connection(ctx)
        args = params.arguments or {}
        try:
            if params.name == TOOL_SEARCH:
                query = args.get("query")
                if not isinstance(query, str) or not query.strip():
                    raise BadInput("tool_search needs a non-empty string `query`")
                servers = args.get("servers")
                if servers is not None and (
                    not isinstance(servers, list) or not all(isinstance(s, str) for s in servers)
                ):
                    raise BadInput("`servers` must be a list of server names")
                top_k = clamp_top_k(args.get("top_k"), gw.cfg.search.default_top_k)
                return json_result(await gw.search(query, top_k, servers, conn))
            if params.name == CATALOG_STATUS:
                return json_result(gw.status(conn))
            if params.name == EXECUTE_TOOL:
                name = args.get("name")
                if not isinstance(name, str) or not name:
                    raise BadInput("execute_tool needs `name`: a matches[].name from tool_search")
                return await gw.execute(name, args.get("arguments"), conn, ctx.session.report_progress,
                                        input=_input_retry(ctx, params))
            # A namespaced name called directly.
            return await gw.execute(params.name, params.arguments, conn, ctx.session.report_progress,
                                    input=_input_retry(ctx, params))
        except BadInput as exc:
            return error_result(str(exc))
        except (UpstreamUnavailable, UpstreamTimeout) as exc:
            return error_result(str(exc))
        except ToolatlasError as exc:
            return error_result(str(exc))

    bus = ConnectionBus(lambda conn: bool(conn.saw_passthrough) or gw.passthrough_for(conn))
    gw.bus = bus
    server: Server[Any] = Server(
        "toolatlas",
        # Lists are per principal (access rules, passthrough): private, and briefly fresh;
        # a change is announced with tools/list_changed.
        cache_hints={"tools/list": CacheHint(ttl_ms=30_000, scope="private")},
        on_subscriptions_listen=ListenHandler(bus),
        version=__version__,
        instructions=f"toolatlas federates these MCP servers: {', '.join(u.name for u in gw.cfg.upstream) or 'none yet'}. Use tool_search to find a tool for your task, then execute_tool to call it.",
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )
    # No OpenTelemetry exporter is configured, so its per-request span middleware only costs
    # time on the hot path: drop it.
    server.middleware = []
    return server


def init_options(server: Server[Any]) -> Any:
    return server.create_initialization_options(NotificationOptions(tools_changed=True))


__all__ = ["CONNECTION", "Connection", "MCPError", "build_server", "error_result", "init_options", "json_result"]
