"""The MCP side of federated resources, prompts, logging and elicitation.

`register(server, gw)` adds the handlers for `resources/list`, `resources/templates/list`,
`resources/read`, `prompts/list`, `prompts/get` and `logging/setLevel` to the SDK server;
their answers come from the gateway's port (`gateway.federation` names and routes them).
`Relays` carries what upstreams send on their own to the clients that may see it:
resource/prompt list changes (handshake-era notifications and 2026-07-28 listen events) and
log messages (at each client's own `logging/setLevel` level). `elicit_relay(ctx)` is how an
upstream's question during a tools/call reaches the calling client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from toolatlas.errors import BadInput, NotFound, RelayRefused, ToolatlasError, UpstreamProtocolError
from toolatlas.gateway.ports import LOG_LEVELS, REQUEST, Connection, ElicitFn, GatewayPort, LogFn, Request

log = logging.getLogger(__name__)

# Upstream log messages being written to one client at once. Each upstream message is
# handled in a task of its own, which waits (up to 2 s) on a client that does not read:
# 30,000 messages held ~125 MB of such tasks and delayed the upstream's answer 9 s, and
# 300,000 stalled its pipe until its health check failed. Past this a client's are dropped.
MAX_LOG_BACKLOG = 16

RESOURCE_NOT_FOUND = -32002  # the spec's code for resources/read of an unknown URI
_LIST_HINT = CacheHint(ttl_ms=30_000, scope="private")


def rpc_error(exc: ToolatlasError, *, not_found: int = types.INVALID_PARAMS) -> MCPError:
    """The JSON-RPC error a client gets for `exc`: the upstream's own code when it answered
    with one, invalid params for what the client asked wrongly."""
    if isinstance(exc, NotFound):
        code = not_found
    elif isinstance(exc, BadInput):
        code = types.INVALID_PARAMS
    elif isinstance(exc, UpstreamProtocolError) and exc.code is not None:
        code = exc.code
    else:
        code = types.INTERNAL_ERROR
    return MCPError(code, str(exc))


def _noted(conn: Connection, ctx: Any, method: str) -> Connection:
    """`conn`, with this request noted in `REQUEST` for the gateway's audit line."""
    REQUEST.set(Request(ctx.request_id, method))
    return conn


def register(server: Server[Any], gw: GatewayPort, connection: Callable[[Any], Connection]) -> None:
    """Add the federated handlers to `server`; `connection(ctx)` is the caller's Connection."""

    async def page(kind: str, ctx: Any, params: types.PaginatedRequestParams | None) -> tuple[list[Any], str | None]:
        try:
            got = await gw.listing(kind, connection(ctx), params.cursor if params is not None else None)
        except ToolatlasError as exc:
            raise rpc_error(exc) from None
        return got.items, got.next_cursor

    async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        items, nxt = await page("resources", ctx, params)
        return types.ListResourcesResult(resources=[types.Resource.model_validate(i) for i in items], next_cursor=nxt)

    async def list_templates(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourceTemplatesResult:
        items, nxt = await page("templates", ctx, params)
        return types.ListResourceTemplatesResult(
            resource_templates=[types.ResourceTemplate.model_validate(i) for i in items], next_cursor=nxt)

    async def list_prompts(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        items, nxt = await page("prompts", ctx, params)
        return types.ListPromptsResult(prompts=[types.Prompt.model_validate(i) for i in items], next_cursor=nxt)

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        try:
            result = await gw.read_resource(str(params.uri), _noted(connection(ctx), ctx, "resources/read"))
        except ToolatlasError as exc:
            raise rpc_error(exc, not_found=RESOURCE_NOT_FOUND) from None
        return types.ReadResourceResult.model_validate(result)

    async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        try:
            result = await gw.get_prompt(params.name, params.arguments, _noted(connection(ctx), ctx, "prompts/get"))
        except ToolatlasError as exc:
            raise rpc_error(exc) from None
        return types.GetPromptResult.model_validate(result)

    async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
        conn = connection(ctx)
        conn.log_level = params.level
        await gw.set_log_level(params.level)
        return types.EmptyResult()

    handlers: Iterable[tuple[str, type[Any], Any]] = (
        ("resources/list", types.PaginatedRequestParams, list_resources),
        ("resources/templates/list", types.PaginatedRequestParams, list_templates),
        ("resources/read", types.ReadResourceRequestParams, read_resource),
        ("prompts/list", types.PaginatedRequestParams, list_prompts),
        ("prompts/get", types.GetPromptRequestParams, get_prompt),
        # Registered here, not as `on_set_logging_level`: the constructor warns it is deprecated
        # (2026-07-28 has no connection-wide level; 2025-era clients still send it).
        ("logging/setLevel", types.SetLevelRequestParams, set_level),
    )
    for method, params_type, handler in handlers:
        server.add_request_handler(method, params_type, handler)
    for method in ("resources/list", "resources/templates/list", "prompts/list"):
        server.cache_hints[method] = _LIST_HINT


def _modern(conn: Connection) -> bool:
    return conn.protocol_version in MODERN_PROTOCOL_VERSIONS


NOTIFY_BOUND_S = 2.0  # how long one client's list_changed notification may take


async def notify_each(conns: Iterable[Connection], send: Callable[[Connection], Awaitable[None]], what: str) -> None:
    """`send` to every connection at once, each bounded by NOTIFY_BOUND_S, so a client that
    is not reading delays nobody else (one after another, N stuck clients held the rest, and
    the upstream listen loop that reported the change, up to 2N s)."""
    async def one(conn: Connection) -> None:
        try:
            with anyio.move_on_after(NOTIFY_BOUND_S):
                await send(conn)
        except Exception as exc:  # a client that went away must not stop the others
            log.debug("%s to connection %d failed: %s", what, conn.id, exc)

    async with anyio.create_task_group() as tg:
        for conn in conns:
            tg.start_soon(one, conn)


class Relays:
    """Carries upstream list changes and log messages to the clients that may see them.

    `connections()` are the live client connections; `publish(event, wants)` puts a
    2026-07-28 listen event on the streams of the connections `wants` accepts."""

    def __init__(self, gw: GatewayPort, connections: Callable[[], Iterable[Connection]],
                 publish: Callable[[Any, Callable[[Connection], bool]], Any]) -> None:
        self._gw = gw
        self._connections = connections
        self._publish = publish
        self._log_backlog: dict[Connection, int] = {}  # log messages being written to a client
        self._log_dropping: set[Connection] = set()  # clients whose log messages are dropped now

    async def lists_changed(self, server: str, kind: str) -> None:
        """Upstream `server`'s resources or prompts changed: tell whoever may use it."""
        await self.tell(kind, lambda conn: self._gw.may_use(conn, server))

    async def tell(self, kind: str, wants: Callable[[Connection], bool]) -> None:
        """`kind` ("resources" or "prompts") list_changed to each connection `wants`."""
        await self._publish(ResourcesListChanged() if kind == "resources" else PromptsListChanged(), wants)

        async def send(conn: Connection) -> None:
            session: Any = conn.session
            if kind == "resources":
                await session.send_resource_list_changed()
            else:
                await session.send_prompt_list_changed()
        targets = [c for c in self._connections() if c.session is not None and not _modern(c) and wants(c)]
        await notify_each(targets, send, f"{kind} list_changed")

    async def log(self, server: str, params: dict[str, Any]) -> None:
        """An upstream log message, to each client that set a level it reaches and may use
        `server`; its logger is prefixed with the server's name (`server` or `server/logger`)."""
        level = params.get("level")
        if level not in LOG_LEVELS:
            return
        note = _log_note(server, params)
        for conn in self._connections():
            if conn.session is None or conn.log_level not in LOG_LEVELS or _modern(conn):
                continue
            if LOG_LEVELS.index(level) < LOG_LEVELS.index(conn.log_level) or not self._gw.may_use(conn, server):
                continue
            backlog = self._log_backlog.get(conn, 0)
            if backlog >= MAX_LOG_BACKLOG:  # dropped for this client, said once until its backlog clears
                if conn not in self._log_dropping:
                    self._log_dropping.add(conn)
                    log.warning("connection %d is not reading: dropping upstream log messages for it while %d wait",
                                conn.id, MAX_LOG_BACKLOG)
                continue
            self._log_backlog[conn] = backlog + 1
            session: Any = conn.session
            try:
                with anyio.move_on_after(2):
                    await session.send_notification(note)
            except Exception as exc:  # a client that went away must not stop the others
                log.debug("log message to connection %d failed: %s", conn.id, exc)
            finally:
                if (left := self._log_backlog[conn] - 1) > 0:
                    self._log_backlog[conn] = left
                else:
                    del self._log_backlog[conn]
                    self._log_dropping.discard(conn)


def _log_note(server: str, params: dict[str, Any]) -> types.LoggingMessageNotification:
    """An upstream's log message as the client gets it: its logger prefixed with the server."""
    logger = params.get("logger")
    return types.LoggingMessageNotification(params=types.LoggingMessageNotificationParams(
        level=params["level"], data=params.get("data"), logger=f"{server}/{logger}" if logger else server))


def log_relay(ctx: Any, conn: Connection) -> tuple[LogFn | None, str | None]:
    """A request's log opt-in: the relay that puts upstream log messages at or above its
    level on this request's stream, and the level; (None, None) without one. A 2026-07-28
    request opts in with `_meta` io.modelcontextprotocol/logLevel; a 2025-era caller's
    opt-in is the level it set with logging/setLevel (a 2026-07-28 upstream sends log
    messages only for a request that asks)."""
    if ctx.session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        wanted = conn.log_level
    else:
        meta = ctx.meta if isinstance(ctx.meta, dict) else {}
        wanted = meta.get(types.LOG_LEVEL_META_KEY)
    if wanted not in LOG_LEVELS:
        return None, None
    session, request_id = ctx.session, ctx.request_id

    async def relay(server: str, params: dict[str, Any]) -> None:
        level = params.get("level")
        if level in LOG_LEVELS and LOG_LEVELS.index(level) >= LOG_LEVELS.index(wanted):
            await session.send_notification(_log_note(server, params), related_request_id=request_id)

    return relay, wanted


ELICIT = types.ClientCapabilities(elicitation=types.ElicitationCapability())


async def cannot_ask(_params: dict[str, Any]) -> dict[str, Any]:
    raise RelayRefused("the calling MCP client did not declare the elicitation capability, so it cannot be asked; "
                       "use a client that supports elicitation")


def elicit_relay(ctx: Any) -> ElicitFn | None:
    """How an upstream's `elicitation/create` during this tools/call reaches the caller: as
    the same request on a 2025-era session that declared elicitation; for a 2026-07-28 caller
    that declared it, None (the gateway turns the question into input_required); otherwise a
    relay that refuses, saying that the client cannot be asked."""
    session = ctx.session
    request_id = ctx.request_id
    if not session.check_client_capability(ELICIT):
        return cannot_ask
    if session.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None

    async def relay(params: dict[str, Any]) -> dict[str, Any]:
        request = types.ElicitRequest.model_validate({"method": "elicitation/create", "params": params})
        try:
            result = await session.send_request(request, types.ElicitResult,
                                                metadata=ServerMessageMetadata(related_request_id=request_id))
        except NoBackChannelError:
            raise RelayRefused("the calling client's connection cannot carry a request from the server "
                               "(a stateless or JSON-response HTTP exchange)") from None
        answer: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return answer

    return relay


__all__ = ["ELICIT", "RESOURCE_NOT_FOUND", "cannot_ask", "Relays", "elicit_relay", "log_relay", "register", "rpc_error"]
