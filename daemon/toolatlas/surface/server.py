"""MCP wiring: one low-level `Server` whose handlers answer for the gateway's port.

Each client connection carries a `Connection` in a contextvar (set by the accept loop before
the transport starts, and carried to handlers by the SDK's context streams), so handlers know
who is asking (peer credentials, client name) without trusting the request.

`Surface` holds what belongs to the MCP side: the server, the registry of live connections
(socket and HTTP), the `subscriptions/listen` fan-out and the fast lane's counter. It reads
the gateway only through `gateway.ports.GatewayPort` and never writes into it.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.subscriptions import ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError

from toolatlas import __version__
from toolatlas.errors import BadInput, ToolatlasError
from toolatlas.gateway.ports import REQUEST, CallRequest, Connection, GatewayPort, Request
from toolatlas.surface import federation, relay
from toolatlas.surface.results import call_result, error_result, json_result
from toolatlas.surface.rpccheck import INTERNAL_ERROR, explain_params
from toolatlas.meta_tools import (AUTO_TOP_K, CATALOG_STATUS, EXECUTE_TOOL, TOOL_SEARCH, clamp_top_k, only_parameters,
                                  servers_arg, tool_format)
from toolatlas.surface.meta import META_SEEN, meta_tools, search_result

log = logging.getLogger(__name__)

CLIENT_INFO_META_KEY = "io.modelcontextprotocol/clientInfo"


CONNECTION: ContextVar[Connection | None] = ContextVar("toolatlas_connection", default=None)
_NOTIFY = NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True)  # what every session hears
# Said after the instructions a client gets while the gateway is still starting.
STARTING = ("The gateway is still starting: the tool count above is of those known so far; more arrive as its servers "
            "finish connecting (tools/list_changed says when), and tool_search finds them once its index is ready.")


def _client_info(ctx: Any) -> tuple[str | None, str | None]:
    """(name, version) of the client's clientInfo: the session's (2025-era handshake) or the
    request's `_meta` (2026-07-28)."""
    params = getattr(ctx.session, "client_params", None)
    if params is not None and getattr(params, "client_info", None) is not None:
        return params.client_info.name, getattr(params.client_info, "version", None)
    meta = ctx.meta
    info = None
    if meta is not None:
        info = meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, dict) else getattr(meta, "model_extra", {}).get(CLIENT_INFO_META_KEY)
    if isinstance(info, dict):
        name, version = info.get("name"), info.get("version")
        return (name if isinstance(name, str) else None), (version if isinstance(version, str) else None)
    return None, None


def _connection(ctx: Any, via: str | None = None) -> Connection:
    """The caller of this request; with `via`, the request is also noted in `REQUEST` for
    the gateway's audit events."""
    conn = CONNECTION.get()
    if conn is None:  # in-process use (tests, tools): an anonymous local connection
        conn = Connection(id=0)
    conn.session = ctx.session
    conn.protocol_version = ctx.session.protocol_version
    name, version = _client_info(ctx)
    if name:
        conn.client_name = name
        conn.client_version = version
    if via is not None:
        REQUEST.set(Request(ctx.request_id, via))
    return conn


def _search_args(gw: GatewayPort, args: dict[str, Any]) -> tuple[str, int, list[str] | None]:
    """tool_search's (query, top_k, servers), or BadInput saying what is wrong (`format` too)."""
    only_parameters(TOOL_SEARCH, args)
    tool_format(args.get("format"))
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise BadInput("tool_search needs a non-empty string `query`")
    return query, clamp_top_k(args.get("top_k"), AUTO_TOP_K), servers_arg(args.get("servers"))


async def tool_search(gw: GatewayPort, conn: Connection, args: dict[str, Any]) -> dict[str, Any]:
    """The tool_search result for `args`; bad input is an isError result, not an exception."""
    try:
        query, top_k, servers = _search_args(gw, args)
        return search_result(await gw.search(query, top_k, servers, conn), args)
    except ToolatlasError as exc:
        return error_result(str(exc))


class Connections:
    """Every live client connection, socket and HTTP alike (what `clients` counts), and the
    2025-era HTTP sessions by `Mcp-Session-Id`: their requests share one `Connection` (its
    log level, its SDK session), so notifications reach the session's event stream between
    requests too."""

    def __init__(self, max_sessions: int = 1024) -> None:
        self._live: dict[Connection, int] = {}  # -> requests in flight on it (an HTTP session has several)
        self._sessions: OrderedDict[str, Connection] = OrderedDict()
        self.max_sessions = max_sessions

    def add(self, conn: Connection) -> None:
        self._live[conn] = self._live.get(conn, 0) + 1

    def discard(self, conn: Connection) -> None:
        if (left := self._live.get(conn, 0) - 1) > 0:
            self._live[conn] = left
        else:
            self._live.pop(conn, None)

    def session(self, session_id: str) -> Connection | None:
        conn = self._sessions.get(session_id)
        if conn is not None:
            self._sessions.move_to_end(session_id)  # in use: the last to be pushed out
        return conn

    def remember(self, session_id: str, conn: Connection) -> None:
        """Over max_sessions, the least recently used session with no request in flight is
        forgotten (one the SDK expired, or abandoned), never one a request (an open event
        stream) is on, unless every one has."""
        self._sessions[session_id] = conn
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.max_sessions:
            idle = next((sid for sid, c in self._sessions.items() if c not in self._live), None)
            self._sessions.pop(idle if idle is not None else next(iter(self._sessions)))

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def everyone(self) -> list[Connection]:
        """The live connections and the remembered HTTP sessions (each once)."""
        return list(dict.fromkeys([*self._live, *self._sessions.values()]))

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self._live))

    def __len__(self) -> int:
        return len(self._live)


class ConnectionBus:
    """The `subscriptions/listen` fan-out (2026-07-28) with the gateway's own rule: a
    listener hears `tools/list_changed` only when the list *its* connection sees changed
    (passthrough views, or the meta-tools' rendered text)."""

    def __init__(self, wants: Callable[[Connection], bool]) -> None:
        self._wants = wants  # does this connection's list change now?
        self._listeners: dict[object, tuple[Connection | None, Callable[[Any], None]]] = {}
        # Told (connection, "resources" | "prompts") as a listen stream opens: what its lists hold from now.
        self.joined: Callable[[Connection, str], object] | None = None

    async def publish(self, event: Any, wants: Callable[[Connection], bool] | None = None) -> None:
        """`event` to every listener whose connection `wants` it (default: a tools list change
        it would see)."""
        wants = wants or self._wants
        for conn, listener in list(self._listeners.values()):
            if conn is not None and not wants(conn):
                continue
            try:
                listener(event)
            except Exception:  # one bad listener must not starve the others
                log.exception("subscription listener raised; continuing")

    def subscribe(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        token = object()
        # Runs inside the listen request's handler: the connection's context is current.
        conn = CONNECTION.get()
        self._listeners[token] = (conn, listener)
        if conn is not None and self.joined is not None:
            for kind in ("resources", "prompts"):
                self.joined(conn, kind)

        def unsubscribe() -> None:
            self._listeners.pop(token, None)
        return unsubscribe

    async def tools_changed(self) -> None:
        await self.publish(ToolsListChanged())


class Surface:
    """The MCP side of the daemon (see the module docstring); satisfies `SurfaceStats`."""

    def __init__(self, gw: GatewayPort) -> None:
        self.gw = gw
        self.connections = Connections()
        self.fast_lane_answers = 0
        self.bus = ConnectionBus(self._list_changes_for)
        self.server = build_server(gw, self.bus)
        self.relays = federation.Relays(gw, self.connections.everyone, self.bus.publish)
        calls = relay.call_lane(gw, self.server, CONNECTION.get) if relay.enabled() else None
        self.lane = relay.combined(fast_lane(gw, self), calls)

    def _list_changes_for(self, conn: Connection) -> bool:
        """Whether `conn`'s tools/list now differs from what it last listed: a passthrough
        view (any catalog change), or meta-tools whose text changed (templates reloaded,
        new domains)."""
        if conn.saw_passthrough or self.gw.passthrough_for(conn):
            return True
        seen = conn.extra.get(META_SEEN)
        return seen is not None and seen != self.gw.meta_tools(conn).fingerprint

    def client_count(self) -> int:
        return len(self.connections)

    def client_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for conn in self.connections:
            counts[conn.endpoint] = counts.get(conn.endpoint, 0) + 1
        return counts

    def fast_answers(self) -> int:
        return self.fast_lane_answers

    async def tools_changed(self) -> None:
        """Tell clients whose tools/list would now differ (passthrough views) to re-list:
        legacy sessions by notification, 2026-07-28 clients on their listen streams."""
        await self.bus.tools_changed()
        # Skipped: connections that never listed, and those that see the three meta-tools
        # with the text they listed.
        targets = [c for c in self.connections.everyone()
                   if c.session is not None and c.saw_passthrough is not None and self._list_changes_for(c)]

        async def send(conn: Connection) -> None:
            await conn.session.send_tool_list_changed()  # type: ignore[attr-defined]
        await federation.notify_each(targets, send, "tools list_changed")


class _Server(Server[Any]):
    """The SDK server with `instructions` per caller: read when a session initializes (or a
    2026-07-28 client discovers), in that connection's context, so they name only the
    upstreams it may use and follow a reload."""

    def __init__(self, gw: GatewayPort, *args: Any, **kwargs: Any) -> None:
        self._gw = gw
        super().__init__(*args, **kwargs)

    @property
    def instructions(self) -> str | None:
        text = self._gw.instructions(CONNECTION.get())
        # Read once, at the session's start: one made while upstreams are still listing would
        # keep "0 tools from these servers" for good, and a model may take it as "no tools".
        return f"{text}\n{STARTING}" if self._gw.starting else text

    @instructions.setter
    def instructions(self, _value: str | None) -> None:
        pass  # computed per caller; the SDK's constructor assigns None

    def create_initialization_options(self, notification_options: NotificationOptions | None = None, *args: Any, **kwargs: Any) -> Any:
        """Saying the list changes the gateway sends (the streamable-HTTP manager gives no options)."""
        return super().create_initialization_options(notification_options or _NOTIFY, *args, **kwargs)

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        """The SDK's capabilities, except that resource subscriptions are not offered: the
        SDK derives `resources.subscribe` from serving subscriptions/listen (2026-07-28), but
        toolatlas does not relay an upstream's notifications/resources/updated (README,
        "Resources and prompts"), so a client must not be told it would hear them."""
        caps = super().get_capabilities(*args, **kwargs)
        if caps.resources is not None and caps.resources.subscribe:
            caps.resources = caps.resources.model_copy(update={"subscribe": False})
        return caps


def internal_error(method: str) -> MCPError:
    """The JSON-RPC error for a handler that failed unexpectedly (logged here, with the
    traceback); the client sees no Python text."""
    log.exception("%s failed", method)
    return MCPError(INTERNAL_ERROR, f"internal error: the gateway failed on this {method}; the daemon's log has the "
                    "details")


def build_server(gw: GatewayPort, bus: ConnectionBus) -> Server[Any]:
    """The MCP server every connection (socket, shim, HTTP) is served by."""

    async def on_list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        conn = _connection(ctx, "tools/list")
        passthrough = gw.passthrough_for(conn)
        conn.saw_passthrough = passthrough
        if not passthrough:
            tools = meta_tools(gw, conn)
        else:
            tools = [
                types.Tool(
                    name=r.name,
                    title=r.title,
                    description=r.description,
                    input_schema=r.input_schema,
                    output_schema=r.output_schema,
                    annotations=types.ToolAnnotations.model_validate(r.annotations) if r.annotations else None,
                )
                for r in gw.visible_records(conn)
            ]
        gw.tools_listed(conn, passthrough=passthrough, tools=len(tools))
        if gw.starting:
            # Upstreams are still listing: this list grows, so no client may cache it (ttl 0,
            # not the 30 s below); tools/list_changed follows each change and the switch to
            # the meta-tools.
            return types.ListToolsResult(tools=tools, ttl_ms=0)
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(
        ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        via = params.name if params.name in (TOOL_SEARCH, CATALOG_STATUS, EXECUTE_TOOL) else "direct"
        conn = _connection(ctx, via)
        args = params.arguments or {}
        try:
            if params.name == TOOL_SEARCH:
                return await tool_search(gw, conn, args)
            if params.name == CATALOG_STATUS:
                return json_result(dict(gw.status(conn)))
            if params.name == EXECUTE_TOOL:
                only_parameters(EXECUTE_TOOL, args)
                name = args.get("name")
                if not isinstance(name, str) or not name:
                    raise BadInput("execute_tool needs `name`: a matches[].name from tool_search")
                call = _call(ctx, conn, params, name, args.get("arguments"))
            else:  # a namespaced name called directly
                call = _call(ctx, conn, params, params.name, params.arguments)
            return call_result(await gw.execute(call, conn))
        except ToolatlasError as exc:  # bad input, an upstream down or slow: a result a model reads
            return error_result(str(exc))
        except MCPError:
            raise
        except Exception as exc:  # a bug: the SDK would answer code 0 with the exception's text
            raise internal_error("tools/call") from exc

    server: Server[Any] = _Server(
        gw,
        "toolatlas",
        # Lists are per principal (access rules, passthrough): private, and briefly fresh;
        # a change is announced with tools/list_changed. While the daemon starts: ttl 0.
        cache_hints={"tools/list": CacheHint(ttl_ms=30_000, scope="private")},
        on_subscriptions_listen=ListenHandler(bus),
        version=__version__,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )
    federation.register(server, gw, _connection)
    # No OpenTelemetry exporter is configured, so its per-request span middleware only costs
    # time on the hot path: drop it. The SDK's bare "Invalid request parameters" is explained.
    server.middleware = [explain_params, functools.partial(_initialize, server)]
    return server


async def _initialize(server: Server[Any], ctx: Any, call_next: Any) -> Any:
    """initialize and server/discover: instructions for the client its clientInfo names (see _Server)."""
    params, conn = (ctx.params or {}) if ctx.method in ("initialize", "server/discover") else {}, CONNECTION.get()
    info = params.get("clientInfo") or (params.get("_meta") or {}).get(CLIENT_INFO_META_KEY)
    if conn is None or not isinstance(info, dict) or not isinstance(name := info.get("name"), str) or not name:
        return await call_next(ctx)
    conn.client_name, conn.client_version = name, info.get("version") if isinstance(info.get("version"), str) else None
    result = await call_next(ctx)
    if isinstance(result, dict) and "instructions" in result:
        result["instructions"] = server.instructions
    return result


def _call(ctx: Any, conn: Connection, params: types.CallToolRequestParams, name: str, arguments: object) -> CallRequest:
    """A tools/call as the gateway takes it. The input_required fields count only on
    2026-07-28 connections: older clients cannot answer an input_required result."""
    modern = ctx.session.protocol_version in MODERN_PROTOCOL_VERSIONS
    log, log_level = federation.log_relay(ctx, conn)
    return CallRequest(
        name=name, arguments=arguments, progress=ctx.session.report_progress, allow_input_required=modern,
        input_responses=params.input_responses if modern else None,
        request_state=params.request_state if modern else None, elicit=federation.elicit_relay(ctx),
        log=log, log_level=log_level, log_scoped_only=not modern,
    )


_FAST_PARAMS = frozenset({"name", "arguments", "_meta"})
_FAST_ARGS = frozenset({"query", "top_k", "servers", "format"})

Lane = Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]] | None]


def fast_lane(gw: GatewayPort, surface: Surface) -> Lane:
    """Serve `tool_search` on the socket without the SDK's per-request machinery (validation
    models, a task per request, the result re-dumped per protocol version): ~1 ms a request
    here, three quarters of a cache hit's time in the daemon and a tenth of a miss's.

    Returns `lane(message)` for the socket's reader. It takes a plain `tools/call` of
    `tool_search` (arguments no more than query, top_k, servers, format; no `_meta`) on a
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
        surface.fast_lane_answers += 1
        REQUEST.set(Request(id_, TOOL_SEARCH))
        try:
            answer = gw.search_cached(*_search_args(gw, args), conn)
        except BadInput:
            answer = None  # tool_search reports it
        if answer is not None:
            return _response(id_, search_result(answer, args))

        async def search() -> dict[str, Any]:
            REQUEST.set(Request(id_, TOOL_SEARCH))
            return _response(id_, await tool_search(gw, conn, args))

        return search()

    return lane


def _response(id_: str | int, result: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC response carrying a tool result as the SDK sends it on a handshake-era
    connection (it drops `resultType`, a 2026-07-28 field)."""
    result.pop("resultType", None)
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def init_options(server: Server[Any]) -> Any:
    return server.create_initialization_options()


__all__ = ["CONNECTION", "Connection", "Connections", "MCPError", "Surface", "build_server", "error_result", "fast_lane",
           "init_options", "json_result"]
