"""MCP wiring: one low-level `Server` whose handlers answer for the Gateway.

Each client connection carries a `Connection` in a contextvar (set by the accept loop before
the transport starts, and carried to handlers by the SDK's context streams), so handlers know
who is asking (peer credentials, client name) without trusting the request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.subscriptions import ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError

from toolatlas import __version__
from toolatlas.errors import BadInput, ToolatlasError
from toolatlas.surface.meta_tools import CATALOG_STATUS, EXECUTE_TOOL, META_TOOLS, TOOL_SEARCH, clamp_top_k

if TYPE_CHECKING:
    from toolatlas.app import Gateway

log = logging.getLogger(__name__)

INVALID_PARAMS = -32602
CLIENT_INFO_META_KEY = "io.modelcontextprotocol/clientInfo"
_encode = msgspec.json.Encoder().encode  # several times faster than json.dumps on a result


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
    protocol_version: str | None = None  # negotiated; set once a request passed the SDK's init gate
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
    conn.protocol_version = ctx.session.protocol_version
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


def json_result(obj: Any, *, is_error: bool = False) -> dict[str, Any]:
    """A meta-tool result: the JSON as text content and as structuredContent.

    A plain mapping in wire form, not a `CallToolResult`: the SDK validates and shapes a
    handler's result for the connection's protocol version either way, so building the model
    first only walks the result twice more (tool_search answers carry full input schemas)."""
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": _encode(obj).decode()}],
        "isError": is_error,
        "resultType": "complete",  # required on 2026-07-28; the SDK drops it for older versions
    }
    if isinstance(obj, dict):
        result["structuredContent"] = obj
    return result


def error_result(message: str) -> dict[str, Any]:
    """An isError result a model can read and act on (wire form, as `json_result`)."""
    return {"content": [{"type": "text", "text": message}], "isError": True, "resultType": "complete"}


def _search_args(gw: "Gateway", args: dict[str, Any]) -> tuple[str, int, list[str] | None]:
    """tool_search's (query, top_k, servers), or BadInput saying what is wrong."""
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise BadInput("tool_search needs a non-empty string `query`")
    servers = args.get("servers")
    if servers is not None and (not isinstance(servers, list) or not all(isinstance(s, str) for s in servers)):
        raise BadInput("`servers` must be a list of server names")
    return query, clamp_top_k(args.get("top_k"), gw.cfg.search.default_top_k), servers


async def tool_search(gw: "Gateway", conn: Connection, args: dict[str, Any]) -> dict[str, Any]:
    """The tool_search result for `args`; bad input is an isError result, not an exception."""
    try:
        query, top_k, servers = _search_args(gw, args)
        return json_result(await gw.search(query, top_k, servers, conn))
    except ToolatlasError as exc:
        return error_result(str(exc))


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
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        conn = _connection(ctx)
        args = params.arguments or {}
        try:
            if params.name == TOOL_SEARCH:
                return await tool_search(gw, conn, args)
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
        except ToolatlasError as exc:  # bad input, an upstream down or slow: a result a model reads
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


_FAST_PARAMS = frozenset({"name", "arguments", "_meta"})
_FAST_ARGS = frozenset({"query", "top_k", "servers"})


def fast_lane(gw: "Gateway") -> Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]] | None]:
    """Serve `tool_search` on the socket without the SDK's per-request machinery (validation
    models, a task per request, the result re-dumped per protocol version): ~1 ms a request
    here, three quarters of a cache hit's time in the daemon and a tenth of a miss's.

    Returns `lane(message)` for the socket's reader. It takes a plain `tools/call` of
    `tool_search` (arguments no more than query, top_k, servers; no `_meta`) on a
    handshake-era connection the SDK has already let through its initialization gate, and
    returns the JSON-RPC response: at once when the result cache holds the answer, else an
    awaitable the reader runs in a task. Anything else (a progress token, a 2026-07-28
    envelope, any other tool or method) returns None and goes to the SDK. Both paths build
    the answer with the same `tool_search` / `json_result` / `error_result`."""

    def lane(msg: dict[str, Any]) -> dict[str, Any] | Awaitable[dict[str, Any]] | None:
        conn = CONNECTION.get()
        if conn is None or conn.protocol_version is None or conn.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        id_, params = msg.get("id"), msg.get("params")
        if msg.get("jsonrpc") != "2.0" or not isinstance(id_, (str, int)) or isinstance(id_, bool):
            return None
        if not isinstance(params, dict):
            return None
        if params.get("name") != TOOL_SEARCH or not params.keys() <= _FAST_PARAMS or params.get("_meta"):
            return None
        args = params.get("arguments")
        if not isinstance(args, dict) or not args.keys() <= _FAST_ARGS:
            return None
        gw.fast_answers += 1
        try:
            answer = gw.search_cached(*_search_args(gw, args), conn)
        except BadInput:
            answer = None  # tool_search reports it
        if answer is not None:
            return _response(id_, json_result(answer))

        async def search() -> dict[str, Any]:
            return _response(id_, await tool_search(gw, conn, args))

        return search()

    return lane


def _response(id_: str | int, result: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC response carrying a tool result as the SDK sends it on a handshake-era
    connection (it drops `resultType`, a 2026-07-28 field)."""
    result.pop("resultType", None)
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def init_options(server: Server[Any]) -> Any:
    return server.create_initialization_options(NotificationOptions(tools_changed=True))


__all__ = ["CONNECTION", "Connection", "MCPError", "build_server", "error_result", "fast_lane", "init_options", "json_result"]
