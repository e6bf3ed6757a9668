"""The raw relay of a tools/call over a stdio upstream's warm session.

The SDK path builds and validates a request model, hands it through the client's dispatcher
(a task, memory streams, a model dump on the child's stdin), parses the reply line into a
JSON-RPC model, validates the result against the protocol version and again as a
`CallToolResult`. The relay writes the request line itself (with the `_meta` the session's
own `_stamp` puts on it, so both protocol eras carry what they carry today) with an id of its own
(``ta-relay-N``), and the child's stdout reader hands the reply line with that id straight
back (`Pending.take`), decoded once, with progress notifications for its token. What the SDK
checks on the way stays: the result is validated against the upstream's protocol version
(`validate_server_result`), a later revision's fields are dropped, structured content is
checked against the tool's output schema (the session's check, outputs.py), errors are the SDK's
own `MCPError`s (JSON-RPC errors, `Connection closed`), so `requests.bounded` maps them as
before, and an abandoned call sends the courtesy `notifications/cancelled`. An
`input_required` for a caller that cannot take one is left to the SDK's driver (the call is
made again that way: a 2026-07-28 tool asks before it acts).
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import weakref
from typing import Any

import anyio
import mcp_types
import msgspec
from mcp import Client
from mcp.client.session import _later_revision_fields  # mcp==2.3.0: the SDK client's own rule
from mcp.shared.exceptions import MCPError
from mcp_types import methods as _methods

from toolatlas.calls import InputRequired, ProgressFn, UpstreamCall, UpstreamReply
from toolatlas.config import Upstream
from toolatlas.jsonlines import MAX_DEPTH, Oversized, deeper_than
from toolatlas.upstream import plain
from toolatlas.upstream.bounded import invalid, refusal, response_problem, too_many_blocks
from toolatlas.upstream.client import MAX_PROGRESS_QUEUED
from toolatlas.upstream.inbound import Inbound
from toolatlas.upstream.outputs import harden

logger = logging.getLogger(__name__)

ID_PREFIX = "ta-relay-"
_MARK = f'"{ID_PREFIX}'.encode()  # an id or progress token of ours on a stdout line
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_ids = itertools.count(1)
_CLOSED = {"jsonrpc": "2.0", "error": {"code": mcp_types.CONNECTION_CLOSED, "message": "Connection closed"}}
_ABANDON_WRITE_TIMEOUT = 2.0


class _Waiter:
    """One relayed request in flight: its reply, and progress notifications not yet passed on."""

    __slots__ = ("event", "progress", "reply")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.reply: dict[str, Any] | None = None
        # Bounded: a caller behind an upstream's flood gets the newest MAX_PROGRESS_QUEUED.
        self.progress: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_PROGRESS_QUEUED)


class Pending:
    """The relayed requests of one stdio child, fed by its stdout reader (`take`)."""

    def __init__(self, up: Upstream) -> None:
        self._up = up
        self._waiting: dict[str, _Waiter] = {}

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def take(self, line: bytes | Oversized) -> bool:
        """Whether `line` belonged to a relayed request (its reply, or a progress
        notification for it); if so it was handed to the waiter and must not be parsed again."""
        if isinstance(line, Oversized):
            if isinstance(line.request_id, str) and line.request_id in self._waiting:
                logger.warning("upstream %s: refused a %d-byte message (limit %d bytes)",
                               self._up.name, line.size, self._up.max_result_bytes)
                self._answer(line.request_id, refusal(self._up, line.request_id).model_dump(by_alias=True,
                                                                                             exclude_none=True))
                return True
            return False
        if _MARK not in line:
            return False
        refused = too_many_blocks(self._up, line)
        if refused is not None:
            if isinstance(refused.id, str) and refused.id in self._waiting:
                self._answer(refused.id, refused.model_dump(by_alias=True, exclude_none=True))
                return True
            return False
        try:
            msg = _decode(line)
        except msgspec.DecodeError:
            return False
        if not isinstance(msg, dict):
            return False
        id_ = msg.get("id")
        if "method" not in msg:
            if isinstance(id_, str) and id_ in self._waiting and ("result" in msg or "error" in msg):
                self._answer(id_, msg)
                return True
            return False
        params = msg.get("params")
        if msg["method"] == "notifications/progress" and id_ is None and isinstance(params, dict):
            waiter = self._waiting.get(params.get("progressToken"))  # type: ignore[arg-type]
            if waiter is not None:
                waiter.progress.append(params)
                waiter.event.set()
                return True
        return False

    def _answer(self, id_: str, reply: dict[str, Any]) -> None:
        waiter = self._waiting.pop(id_, None)
        if waiter is not None:
            waiter.reply = reply
            waiter.event.set()

    def close(self) -> None:
        """The child's stdout ended: every waiter gets the SDK's `Connection closed`."""
        for id_ in list(self._waiting):
            self._answer(id_, _CLOSED)

    async def request(self, send: Any, message: dict[str, Any], progress: ProgressFn | None) -> dict[str, Any]:
        """Write `message` (given an id of ours) with `send(bytes)` and return the reply
        (the whole JSON-RPC response, decoded). Progress notifications for its token go to
        `progress` from this task. Cancelled (a timeout, the caller gone): the courtesy
        `notifications/cancelled` goes out, as the SDK's dispatcher sends it."""
        id_ = f"{ID_PREFIX}{next(_ids)}"
        message["id"] = id_
        if progress is not None:
            message["params"].setdefault("_meta", {})["progressToken"] = id_
        waiter = self._waiting[id_] = _Waiter()
        logger.debug("upstream %s: %s relayed as %s", self._up.name, message.get("method"), id_)
        written = False
        try:
            try:
                written = True
                await send(_encode(message) + b"\n")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                raise MCPError(code=mcp_types.CONNECTION_CLOSED, message="Connection closed") from None
            while True:
                await waiter.event.wait()
                if waiter.reply is None:  # progress came first: wait again on a new event
                    waiter.event = anyio.Event()
                while waiter.progress and progress is not None:
                    await _report(progress, waiter.progress.popleft())
                waiter.progress.clear()
                if waiter.reply is not None:
                    return waiter.reply
        except anyio.get_cancelled_exc_class():
            if written and self._waiting.pop(id_, None) is not None:
                with anyio.move_on_after(_ABANDON_WRITE_TIMEOUT, shield=True):
                    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                              "params": {"requestId": id_, "reason": "caller cancelled"}}
                    try:
                        await send(_encode(cancel) + b"\n")
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass
            raise
        finally:
            self._waiting.pop(id_, None)


async def _report(progress: ProgressFn, params: dict[str, Any]) -> None:
    """One progress notification to the caller, typed as the SDK's callback gets it."""
    try:
        value = float(params["progress"])
        total = params.get("total")
        message = params.get("message")
        await progress(value, float(total) if total is not None else None, message if isinstance(message, str) else None)
    except Exception:  # as the SDK's dispatcher: a failing progress callback never fails the call
        logger.exception("progress callback raised")


def resource_uris(result: dict[str, Any]) -> tuple[str, ...]:
    """`federation.resource_uris` of a wire-form result."""
    uris: list[str] = []
    content = result.get("content")
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "resource_link" and isinstance(block.get("uri"), str):
            uris.append(block["uri"])
        elif block.get("type") == "resource" and isinstance(block.get("resource"), dict):
            uri = block["resource"].get("uri")
            if isinstance(uri, str):
                uris.append(uri)
    return tuple(uris)


@functools.lru_cache(maxsize=16)
def _later_fields(version: str) -> frozenset[str]:
    """The SDK client's rule for a tools/call result on `version` (fixed per version)."""
    return _later_revision_fields("tools/call", version)


# A session's request stamp (mcp==2.3.0's `_stamp`: the 2025-era handshake stamp puts headers
# only, the 2026-07-28 one also the protocol version, client info and capabilities, and a
# log level, in `_meta`) puts the same `_meta` on every tools/call; only its HTTP headers
# depend on the call. The `_meta` is read once per stamp from a probe request.
_STAMPED: weakref.WeakKeyDictionary[Any, dict[str, Any] | None] = weakref.WeakKeyDictionary()


def _stamped_meta(session: Any) -> dict[str, Any] | None:
    """The `_meta` the SDK session's stamp puts on a tools/call request (None: none)."""
    stamp = session._stamp  # noqa: SLF001 (mcp==2.3.0)
    try:
        return _STAMPED[stamp]
    except KeyError:
        probe: dict[str, Any] = {"method": "tools/call", "params": {}}
        stamp(probe, {})
        meta = _STAMPED[stamp] = probe["params"].get("_meta") or None
        return meta


async def relay_call(client: Client, pending: Pending, send: Any, call: UpstreamCall, inbound: Inbound) -> UpstreamReply:
    """`call` on `client`'s warm stdio session through the relay; the reply's `payload` is
    the wire-form result (a dict). Raises what the SDK path raises (see the module docstring)."""
    from toolatlas.upstream.requests import call_tool  # the SDK path, for what the relay leaves to it

    session = client.session
    data: dict[str, Any] = {"method": "tools/call", "params": {"name": call.tool}}
    if call.arguments is not None:
        data["params"]["arguments"] = call.arguments
    if call.allow_input_required:
        if call.input_responses:
            data["params"]["inputResponses"] = dict(call.input_responses)
        if call.request_state is not None:
            data["params"]["requestState"] = call.request_state
    meta = _stamped_meta(session)
    if meta is not None:
        data["params"]["_meta"] = dict(meta)
    message = {"jsonrpc": "2.0", "id": None, **data}
    with inbound.call(call.tool, call.elicit, call.log, call.log_scoped_only):
        reply = await pending.request(send, message, call.progress)
    problem = response_problem(reply)
    if problem is not None:  # as the stdio transport answers the SDK path's request
        raise MCPError.from_error_data(invalid(call.tool, problem).error)
    error = reply.get("error")
    if error is not None:
        err = mcp_types.ErrorData.model_validate(error)
        raise MCPError(code=err.code, message=err.message, data=err.data)
    result = reply.get("result")
    version = client.protocol_version or "2025-11-25"
    # the SDK's `validate_server_result` is this call with its output dropped: keep it
    wire: dict[str, Any] | None = plain.wire(version, result)  # the same, by hand, for a plain result
    try:
        if wire is None:
            wire = _methods.serialize_server_result("tools/call", version, result)  # type: ignore[arg-type]
    except KeyError:
        wire = None
    except ValueError:  # pydantic's "Maximum serialization depth exceeded": what the SDK path says
        if not deeper_than(result, MAX_DEPTH):
            raise
        raise MCPError.from_error_data(invalid(call.tool, f"it nests deeper than the {MAX_DEPTH} levels the MCP SDK "
                                                          "reads").error) from None
    if not isinstance(result, dict):
        raise MCPError(code=mcp_types.INTERNAL_ERROR, message="tools/call result is not an object")
    foreign = _later_fields(version)
    if not foreign.isdisjoint(result):
        result = {k: v for k, v in result.items() if k not in foreign}
    if result.get("resultType") == "input_required":
        if not call.allow_input_required:
            return await call_tool(client, call, inbound)  # the SDK's driver asks the caller
        return UpstreamReply(input_required=InputRequired(result.get("inputRequests"), result.get("requestState")))
    # The SDK path hands on `CallToolResult.model_validate(result).model_dump(exclude_none=True)`:
    # its two non-None defaults are the only keys that adds.
    if "isError" not in result or "resultType" not in result:
        wire = None  # the sieve of `result` without them differs: the surface sieves it
        result.setdefault("isError", False)
        result.setdefault("resultType", "complete")
    is_error = bool(result.get("isError"))
    if not is_error:
        await _check_output(session, call.tool, result)
    if wire is not None:  # what the surface's serializer makes of `result` for this version
        return UpstreamReply(payload=wire, is_error=is_error, resource_uris=resource_uris(result), wire_version=version)
    return UpstreamReply(payload=result, is_error=is_error, resource_uris=resource_uris(result))


async def _check_output(session: Any, tool: str, result: dict[str, Any]) -> None:
    """The session's structured-content check (outputs.py: the SDK's decisions and messages,
    hostile schemas handled), on the result as it came."""
    await harden(session).check(tool, result.get("structuredContent"), "structuredContent" in result)


__all__ = ["ID_PREFIX", "Pending", "relay_call", "resource_uris"]
