"""Streamable-HTTP answers that are not MCP, said as what they are.

The SDK's client turns an answer to a request that is not JSON-RPC into a JSON-RPC error of
its own making: "Server returned an error response" (-32603) for a 503, "Not Found"
(-32601) for the 404 of a wrong URL, "Unexpected content type: text/html" for a login
page, and pydantic's many-line report for a JSON body it could not parse. None of them says
what came, and the last put a validation report into the upstream's status and into what a
model reads. `answers_hook` replaces such a body, before the SDK reads it, by a JSON-RPC
error for the request that does: the HTTP status, the URL, the Content-Type and the start of
the body, or what makes a JSON body not JSON-RPC (as the stdio and SSE transports say it).

Each message event of an event stream answering a request is checked the same way. A 404
on a session id (the server forgot the session, and did not run the request) becomes the
error `client.session_forgotten` knows, so that the request is made again on the next
session (`requests.on_session`). Answers the SDK already explains keep its handling:
401/403 (`client.AuthWatch`), a redirect, a 202, and a JSON-RPC error at any status.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2
import mcp_types
import msgspec
from mcp.client.streamable_http import MCP_SESSION_ID

from toolatlas.config import HttpUpstream
from toolatlas.jsonlines import is_request_id
from toolatlas.upstream.bounded import invalid, response_problem
from toolatlas.upstream.client import AUTH_STATUSES, FORGOTTEN, STAND_IN, shown_url

logger = logging.getLogger(__name__)

# Characters of an unexpected body quoted in the error.
SNIPPET = 120
# Bytes read of an answer that is not a JSON reply (an error status's JSON-RPC error is short).
ERROR_BODY_BYTES = 64 * 1024
JSON, EVENTS = "application/json", "text/event-stream"


class _Request(msgspec.Struct):
    id: Any = None
    method: Any = None


_decode_request = msgspec.json.Decoder(_Request).decode
_decode_spans = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode = msgspec.json.Decoder().decode


def _posted_request(request: httpx2.Request) -> tuple[str | int, str] | None:
    """(id, method) of the JSON-RPC request a POST carried, or None (a notification, a
    response of ours, another method)."""
    if request.method != "POST":
        return None
    try:
        msg = _decode_request(request.content)
    except (msgspec.DecodeError, msgspec.ValidationError, httpx2.RequestNotRead):
        return None
    return (msg.id, msg.method) if is_request_id(msg.id) and isinstance(msg.method, str) else None


def _content_type(response: httpx2.Response) -> str:
    return response.headers.get("content-type", "").partition(";")[0].strip().lower()


def _not_json_rpc(body: bytes, what: str = "its body") -> str | None:
    """What makes `body` (a JSON reply, or an event's data: `what`) not one JSON-RPC message,
    or None when it is one. Its result is not decoded (a large one is only scanned)."""
    try:
        spans = _decode_spans(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        try:
            _decode(body)
        except msgspec.DecodeError:
            return f"{what} is not JSON"
        return f"{what} is not a JSON object"
    if "method" in spans:
        return None  # a request or notification of the server's: the SDK takes it
    if "result" not in spans and "error" not in spans:
        return "it has neither a `result` nor an `error`"
    msg = {key: _decode(value) for key, value in spans.items() if key in ("jsonrpc", "error")}
    if "result" in spans:
        msg["result"] = {} if bytes(memoryview(spans["result"])[:1]) == b"{" else _decode(spans["result"])
    return response_problem(msg)


def _error_status(body: bytes) -> bool:
    """Whether `body` is a JSON-RPC error (which the SDK passes on at any HTTP status)."""
    try:
        msg = _decode(body)
    except msgspec.DecodeError:
        return False
    return isinstance(msg, dict) and "error" in msg and response_problem(msg) is None


def answered(status: int, reason: str, url: str, content_type: str, body: bytes) -> str:
    """What an HTTP answer that is not JSON-RPC was: its status (and, at a 2xx, its
    Content-Type) at `url`, and the start of its body."""
    if status >= 400 or status < 200:
        what = f"HTTP {status}" + (f" ({reason})" if reason else "") + f" at {url}"
    else:
        kind = f"Content-Type {content_type}" if content_type else "no Content-Type"
        what = f"HTTP {status} at {url} with {kind}, not JSON-RPC"
    text = body[:SNIPPET * 4].decode(errors="replace").strip()
    return f"the upstream answered {what}" + (f": {text[:SNIPPET]!r}" if text else "")


class _Checked(httpx2.AsyncByteStream):
    """A reply body (already bounded by max_result_bytes) passed on when it is JSON-RPC, or
    replaced by the error that says what it was."""

    def __init__(self, up: HttpUpstream, response: httpx2.Response, body: httpx2.AsyncByteStream,
                 request: tuple[str | int, str], content_type: str) -> None:
        self._up, self._body, self._request, self._content_type = up, body, request, content_type
        self._status, self._reason = response.status_code, response.reason_phrase
        self._url = shown_url(str(response.request.url))

    def _problem(self, body: bytes) -> str | None:
        if self._status >= 400:
            if self._content_type == JSON and _error_status(body):
                return None
        elif self._content_type == JSON:
            problem = _not_json_rpc(body)
            return None if problem is None else invalid(0, problem).error.message
        return answered(self._status, self._reason, self._url, self._content_type, body)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # Only a JSON reply is read whole (bounded by max_result_bytes); of any other answer the
        # start is enough, and its end may be far or never (a proxy's error page left open).
        whole = self._status < 300 and self._content_type == JSON
        parts, size = [], 0
        async for chunk in self._body:
            parts.append(chunk)
            size += len(chunk)
            if not whole and size > ERROR_BODY_BYTES:
                break
        body = b"".join(parts)
        problem = self._problem(body)
        if problem is None:
            yield body
            return
        request_id, method = self._request
        # Said where it is reported (the connection's failure, the call's error), not here too.
        logger.debug("upstream %s: %s failed: %s", self._up.name, method, problem)
        # A 404 without a session id stays the SDK's METHOD_NOT_FOUND: the method is not served
        # there (a 2025-era server's answer to server/discover, a server without subscriptions/listen).
        code = mcp_types.METHOD_NOT_FOUND if self._status == 404 else mcp_types.INTERNAL_ERROR
        error = mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id,  # toolatlas's words (STAND_IN), not the upstream's
                                       error=mcp_types.ErrorData(code=code, message=problem, data=dict(STAND_IN)))
        yield error.model_dump_json(by_alias=True, exclude_unset=True).encode()

    async def aclose(self) -> None:
        await self._body.aclose()


def _event_data(event: bytes) -> bytes | None:
    """The data of a whole server-sent event (as `bounded.BoundedEvents` passes it on) when it
    is a message event, else None."""
    kind, data = b"message", []
    for line in event.split(b"\n"):
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"event":
            kind = value
        elif field == b"data":
            data.append(value)
    return b"\n".join(data) if kind == b"message" and data and any(data) else None


class _CheckedEvents(httpx2.AsyncByteStream):
    """An event stream answering a request (whole events, bounded by max_result_bytes), each
    message that is not JSON-RPC replaced by the error that says so, for that request (the
    SDK failed it with pydantic's many-line report, and logged its traceback)."""

    def __init__(self, up: HttpUpstream, body: httpx2.AsyncByteStream, request: tuple[str | int, str]) -> None:
        self._up, self._body, self._request = up, body, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for event in self._body:
            data = _event_data(event)
            problem = None if data is None else _not_json_rpc(data, "its event's data")
            if problem is None:
                yield event
                continue
            request_id, method = self._request
            logger.debug("upstream %s: %s failed: an event that is not JSON-RPC: %s", self._up.name, method, problem)
            yield b"event: message\ndata: " + invalid(request_id, problem).model_dump_json(
                by_alias=True, exclude_unset=True).encode() + b"\n\n"

    async def aclose(self) -> None:
        await self._body.aclose()


class _Forgotten(httpx2.AsyncByteStream):
    """The 404 of a session the server forgot, as the JSON-RPC error `client.session_forgotten` knows."""

    def __init__(self, body: Any, request_id: str | int, url: str) -> None:
        self._body, self._id, self._url = body, request_id, url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for _chunk in self._body:
            pass
        error = mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, data=FORGOTTEN, message=(
            f"the upstream no longer knows this session (HTTP 404 at {self._url}), so it did not run the request"))
        yield mcp_types.JSONRPCError(jsonrpc="2.0", id=self._id, error=error).model_dump_json(
            by_alias=True, exclude_unset=True).encode()

    async def aclose(self) -> None:
        await self._body.aclose()


def answers_hook(up: HttpUpstream) -> Callable[[httpx2.Response], Awaitable[None]]:
    """An httpx2 response hook (after `bounded.limit_hook`) that replaces an answer to a
    request that is not JSON-RPC by the JSON-RPC error saying what it was (module docstring)."""

    async def hook(response: httpx2.Response) -> None:
        status = response.status_code
        request = _posted_request(response.request)
        if request is None or status < 200 or status == 202 or status in AUTH_STATUSES:
            return
        if 300 <= status < 400 and "location" in response.headers:
            return  # the SDK names where it was sent and why it did not follow
        if status == 404 and MCP_SESSION_ID in response.request.headers:
            # The server no longer knows the session (it restarted, or expired it): the session
            # reconnects (transports._response_hook), and this request, which did not run, may
            # be made again on the new one (requests.on_session).
            response.stream = _Forgotten(response.stream, request[0], shown_url(str(response.request.url)))
            response.headers["content-type"] = JSON
            return
        content_type = _content_type(response)
        body = response.stream
        assert isinstance(body, httpx2.AsyncByteStream)  # an AsyncClient's response
        if status < 300 and content_type == EVENTS:
            response.stream = _CheckedEvents(up, body, request)
            return
        whole = status < 300 and content_type == JSON  # else only the start is read: not through the limit's whole read
        response.stream = _Checked(up, response, body if whole else getattr(body, "raw", body), request, content_type)
        response.headers["content-type"] = JSON  # so the SDK reads the error it gets

    return hook


__all__ = ["answered", "answers_hook"]
