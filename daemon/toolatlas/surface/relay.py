"""The socket's raw relay of `execute_tool` and direct namespaced calls.

The SDK's server path validates the request into models, runs it through its dispatcher
(middleware, a task, context streams) and dumps the response model again; on the upstream
side the SDK client does the same in reverse. For the common call the relay skips that: the
socket reader hands it the decoded request (`lane`), the gateway checks and routes it as
always (`GatewayPort.execute`: access rules, argument validation, sealed input state,
timeouts, metrics and events), with `raw=True` so a stdio upstream's warm session answers
through `upstream.relay`, and the result goes back shaped exactly as the SDK server shapes a
tools/call result for the caller's protocol version (`serialize`: the version's surface,
`resultType`, the `serverInfo` `_meta` stamp of 2026-07-28), so the bytes out are the ones
the SDK path writes for the same upstream reply.

It takes a `tools/call` on a connection the SDK has already let through its initialization
gate, with params no more than name, arguments and `_meta`, and `_meta` no more than the
2026-07-28 envelope (protocol version, client info and capabilities) on a modern connection
and a progress token (either era). Everything else returns None and goes to the SDK, chosen
per request: the meta-tools tool_search (its own fast lane) and catalog_status, a retry with
`inputResponses`/`requestState`, a per-request log level, a 2025-era caller that declared
elicitation (the SDK session relays the upstream's question to it) or set a log level,
malformed input (the SDK's own error). Progress notifications go to the caller on its connection; a
`notifications/cancelled` for the request, or the caller going away, cancels it (the socket
reader cancels the task, and the upstream gets its courtesy cancel).

`TOOLATLAS_RAW_RELAY=0` in the daemon's environment turns the relay off (every call takes
the SDK path), for comparisons.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
import msgspec
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from toolatlas.errors import ToolatlasError
from toolatlas.gateway.ports import REQUEST, CallOutcome, CallRequest, Connection, ElicitFn, GatewayPort, Request
from toolatlas.meta_tools import CATALOG_STATUS, EXECUTE_TOOL, TOOL_SEARCH
from toolatlas.surface.federation import ELICIT, cannot_ask
from toolatlas.surface.results import call_result, error_result
from toolatlas.surface.rpccheck import INTERNAL_ERROR

log = logging.getLogger(__name__)

ENV_SWITCH = "TOOLATLAS_RAW_RELAY"
_PARAMS = frozenset({"name", "arguments", "_meta"})
_MODERN_META = frozenset({types.PROTOCOL_VERSION_META_KEY, types.CLIENT_INFO_META_KEY,
                          types.CLIENT_CAPABILITIES_META_KEY, "progressToken"})
_LEGACY_META = frozenset({"progressToken"})
_EXECUTE_ARGS = frozenset({"name", "arguments"})
_encode = msgspec.json.Encoder().encode

Send = Callable[[bytes], Awaitable[None]]
Lane = Callable[[dict[str, Any], Send], "dict[str, Any] | Awaitable[dict[str, Any]] | None"]


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def serialize(server: Server[Any], version: str, result: dict[str, Any], *, sieved: bool = False) -> dict[str, Any]:
    """A tools/call handler's wire-form result as the SDK server sends it on `version`
    (`ServerRunner._serialize` of mcp 2.3.0 for tools/call, which has no cache hint): the
    version's result surface (skipped when `sieved`: `result` came through it already),
    `resultType` on 2026-07-28 and the `serverInfo` stamp."""
    modern = version in MODERN_PROTOCOL_VERSIONS
    result_type = result.get("resultType")
    if sieved:
        pass
    elif not modern or not isinstance(result_type, str) or result_type in types.CORE_RESULT_TYPES:
        try:
            result = _methods.serialize_server_result("tools/call", version, result)
        except ValidationError:
            log.exception("handler for %r returned an invalid result", "tools/call")
            raise MCPError(code=types.INTERNAL_ERROR, message="Handler returned an invalid result") from None
    if not modern:
        return result
    if result.get("resultType") is None:
        result["resultType"] = "complete"
    meta = result.get("_meta")
    if meta is None:
        result["_meta"] = {types.SERVER_INFO_META_KEY: server.server_info_stamp}
    elif isinstance(meta, dict) and meta.get(types.SERVER_INFO_META_KEY) is None:
        result["_meta"] = {**meta, types.SERVER_INFO_META_KEY: server.server_info_stamp}
    return result


def dumped(outcome: CallOutcome) -> dict[str, Any]:
    """A routed call's result in wire form, as the SDK server dumps a handler's result."""
    payload: Any = outcome.payload if outcome.input_required is None else call_result(outcome)
    if isinstance(payload, dict):
        return dict(payload)
    if isinstance(payload, BaseModel):
        out: dict[str, Any] = payload.model_dump(by_alias=True, mode="json", exclude_none=True)
        return out
    raise ToolatlasError(f"upstream returned {type(payload).__name__}, not a tool result")


def _envelope(conn: Connection, meta: object) -> tuple[str, bool, str | int | None] | None:
    """(protocol version, elicitation declared, progress token) of a request the relay may
    take on `conn`, or None when its `_meta` is beyond what the relay covers."""
    version = conn.protocol_version
    if version is None:
        return None
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        return None
    token = meta.get("progressToken")
    if token is not None and (not isinstance(token, (str, int)) or isinstance(token, bool)):
        return None
    if version in MODERN_PROTOCOL_VERSIONS:
        if not meta.keys() <= _MODERN_META:
            return None
        version = meta.get(types.PROTOCOL_VERSION_META_KEY)
        caps = meta.get(types.CLIENT_CAPABILITIES_META_KEY)
        info = meta.get(types.CLIENT_INFO_META_KEY)
        if version not in MODERN_PROTOCOL_VERSIONS or not isinstance(caps, dict):
            return None
        if not all(isinstance(v, dict) for v in caps.values()):
            return None
        if info is not None and not (isinstance(info, dict) and isinstance(info.get("name"), str)
                                     and isinstance(info.get("version"), str)):
            return None
        return version, caps.get("elicitation") is not None, token
    if not meta.keys() <= _LEGACY_META:
        return None
    session: Any = conn.session
    if session is None:
        return None
    return version, bool(session.check_client_capability(ELICIT)), token


def _progress(send: Send, token: str | int) -> Callable[[float, float | None, str | None], Awaitable[None]]:
    async def progress(value: float, total: float | None, message: str | None) -> None:
        params: dict[str, Any] = {"progressToken": token, "progress": value}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await send(_encode({"jsonrpc": "2.0", "method": "notifications/progress", "params": params}) + b"\n")

    return progress


def call_lane(gw: GatewayPort, server: Server[Any], current: Callable[[], Connection | None]) -> Lane:
    """The relay's lane for the socket reader: `lane(request, send)` returns an awaitable of
    the JSON-RPC response, or None to leave the request to the SDK. `current()` is the
    reading connection."""

    def lane(msg: dict[str, Any], send: Send) -> Awaitable[dict[str, Any]] | None:
        conn = current()
        id_, params = msg.get("id"), msg.get("params")
        if conn is None or msg.get("jsonrpc") != "2.0" or not isinstance(id_, (str, int)) or isinstance(id_, bool):
            return None
        if not isinstance(params, dict) or not params.keys() <= _PARAMS:
            return None
        name, args = params.get("name"), params.get("arguments")
        if not isinstance(name, str) or name in (TOOL_SEARCH, CATALOG_STATUS):
            return None
        if args is not None and not isinstance(args, dict):
            return None
        envelope = _envelope(conn, params.get("_meta"))
        if envelope is None:
            return None
        version, asks, token = envelope
        modern = version in MODERN_PROTOCOL_VERSIONS
        info = params.get("_meta", {}).get(types.CLIENT_INFO_META_KEY) if modern else None
        if isinstance(info, dict):  # checked by _envelope: name and version are strings
            conn.client_name, conn.client_version = info["name"], info["version"]
        if asks and not modern:
            return None  # the SDK session carries the upstream's question to this caller
        if not modern and conn.log_level is not None:
            return None  # the SDK path asks a 2026-07-28 upstream for its log messages at that level
        if name == EXECUTE_TOOL:
            target = (args or {}).get("name")
            if not isinstance(target, str) or not target or not (args or {}).keys() <= _EXECUTE_ARGS:
                return None  # the SDK path says what is missing or extra
            arguments = (args or {}).get("arguments")
        else:
            target, arguments = name, args
        elicit: ElicitFn | None = None if asks else cannot_ask
        call = CallRequest(name=target, arguments=arguments, progress=_progress(send, token) if token is not None else None,
                           allow_input_required=modern, elicit=elicit, raw=True)
        return _answer(gw, server, conn, id_, version, call, EXECUTE_TOOL if name == EXECUTE_TOOL else "direct")

    return lane


async def _answer(gw: GatewayPort, server: Server[Any], conn: Connection, id_: str | int, version: str,
                  call: CallRequest, via: str) -> dict[str, Any]:
    """The JSON-RPC response to one relayed call (what `on_call_tool` and the SDK answer);
    `via` names the surface in the audit events (execute_tool or direct)."""
    REQUEST.set(Request(id_, via))
    try:
        sieved = False
        try:
            outcome = await gw.execute(call, conn)
            result, sieved = dumped(outcome), outcome.wire_version == version and outcome.input_required is None
        except ToolatlasError as exc:  # bad input, an upstream down or slow: a result a model reads
            result = error_result(str(exc))
        return {"jsonrpc": "2.0", "id": id_, "result": serialize(server, version, result, sieved=sieved)}
    except MCPError as exc:
        error: dict[str, Any] = {"code": exc.error.code, "message": exc.error.message}
        if exc.error.data is not None:
            error["data"] = exc.error.data
        return {"jsonrpc": "2.0", "id": id_, "error": error}
    except Exception:  # a bug: logged here with its traceback; the client sees no Python text
        log.exception("tools/call failed")
        return {"jsonrpc": "2.0", "id": id_, "error": {
            "code": INTERNAL_ERROR,
            "message": "internal error: the gateway failed on this tools/call; the daemon's log has the details"}}


def combined(search: Callable[[dict[str, Any]], Any], calls: Lane | None) -> Lane:
    """One lane for the socket reader: tool_search to the search lane, other calls to the relay."""

    def lane(msg: dict[str, Any], send: Send) -> Any:
        params = msg.get("params")
        if isinstance(params, dict) and params.get("name") == TOOL_SEARCH:
            return search(msg)
        return calls(msg, send) if calls is not None else None

    return lane


__all__ = ["ENV_SWITCH", "Lane", "call_lane", "combined", "dumped", "enabled", "serialize"]
