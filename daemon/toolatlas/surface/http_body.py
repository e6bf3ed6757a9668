"""What the HTTP endpoint answers before the SDK sees a request: JSON-RPC errors with an HTTP
status, and the screening of a POST body (its type, its size, the message in it); and, after,
the words for a refusal the SDK sends with no body or too few (`explain_bare`)."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from mcp.shared.inbound import MCP_METHOD_HEADER, MCP_NAME_HEADER, NAME_BEARING_METHODS
from mcp_types import PROTOCOL_VERSION_META_KEY
from mcp_types.jsonrpc import HEADER_MISMATCH
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from toolatlas.surface.admin import ADMIN_PREFIX
from toolatlas.surface.rpccheck import INVALID_REQUEST, Refusal, screen


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A `receive` that hands out `messages` first, then reads on."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


async def screen_body(scope: Scope, receive: Receive,
                      limit: int) -> tuple[Response | None, Receive, types.JSONRPCMessage | None]:
    """Read a POST body (up to `limit`, [daemon] max_message_bytes) and screen it as the socket
    screens a line (surface.rpccheck); the SDK then gets the same body, replayed. Refused, with
    a JSON-RPC error saying what to send instead: a body that is not `application/json` (400),
    one over the limit (413, unread when its Content-Length says so), a malformed message, one
    under an MCP-Protocol-Version header that names no known version, or a 2026-07-28 request
    without its Mcp-Method or Mcp-Name header (400).
    A client gone before its body arrived (it left, or the body timeout closed it) gets a
    refusal no one reads: the SDK never sees the request. Also the message in the body."""
    headers = dict(scope.get("headers", []))
    content_type = headers.get(b"content-type", b"").decode("latin-1")
    if not content_type.lower().startswith("application/json"):
        return json_error(400, f"Content-Type must be application/json, not {content_type[:80]!r}: send the "
                           "JSON-RPC message as application/json"), receive, None
    too_large = json_error(413, f"the request body exceeds the {limit}-byte limit ([daemon] max_message_bytes) "
                            "and was not read; send a smaller message")
    declared = headers.get(b"content-length", b"")
    if declared.isdigit() and int(declared) > limit:
        return too_large, receive, None
    body: list[bytes] = []
    more, size = True, 0
    while more and size <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return json_error(400, "the client went away before its request body arrived"), receive, None
        body.append(message.get("body", b""))
        size += len(body[-1])
        more = message.get("more_body", False)
    if size > limit:
        return too_large, receive, None
    data = b"".join(body)
    parsed, refusal = screen(data)
    method = getattr(parsed, "method", None)
    if isinstance(method, str) and method.startswith(ADMIN_PREFIX):
        refusal = Refusal(-32601, f"{method[:80]} is an operator command: the daemon serves those only on "
                          "its Unix socket, to the user it runs as (toolatlas upstream ..., toolatlas reload)",
                          getattr(parsed, "id", None))
    if refusal is None:
        refusal = _unknown_version(headers.get(b"mcp-protocol-version"), parsed) or _missing_header(headers, parsed)
    if refusal is not None:
        return JSONResponse(refusal.payload(), status_code=400), receive, None
    return None, _replay([{"type": "http.request", "body": data, "more_body": False}], receive), parsed


def _unknown_version(value: bytes | None, message: Any) -> Refusal | None:
    """A request or notification whose MCP-Protocol-Version header names no version the SDK
    speaks, and whose params carry no 2026-07-28 envelope: the SDK would take it for a
    2026-07-28 one and say only that `params._meta` lacks its keys, sending a client with a
    mistyped header after an envelope it never needed."""
    version = value.decode("latin-1") if value is not None else None
    params = getattr(message, "params", None)
    meta = params.get("_meta") if isinstance(params, dict) else None
    if (version is None or version in HANDSHAKE_PROTOCOL_VERSIONS or version in MODERN_PROTOCOL_VERSIONS
            or isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta):
        return None
    return Refusal(INVALID_REQUEST, f"MCP-Protocol-Version {version[:40]!r} is not a version this server speaks: "
                   f"after initialize send the one it negotiated ({', '.join(HANDSHAKE_PROTOCOL_VERSIONS)}); "
                   f"{', '.join(MODERN_PROTOCOL_VERSIONS)} requests carry theirs in params._meta too",
                   getattr(message, "id", None))


def _missing_header(headers: dict[bytes, bytes], message: Any) -> Refusal | None:
    """A 2026-07-28 request without its Mcp-Method header, or without Mcp-Name where its method
    names a tool, prompt or resource: the SDK says only that the header "does not match" the
    body, which reads as a wrong value where none was sent."""
    if headers.get(b"mcp-protocol-version", b"").decode("latin-1") not in MODERN_PROTOCOL_VERSIONS or not isinstance(
            message, types.JSONRPCRequest) or not isinstance(message.params, dict) or not isinstance(
            meta := message.params.get("_meta"), dict) or PROTOCOL_VERSION_META_KEY not in meta:
        return None  # (the SDK's envelope check speaks first)
    key = NAME_BEARING_METHODS.get(message.method)
    value = message.params.get(key) if key is not None else None
    if MCP_METHOD_HEADER.encode() not in headers:
        missing, value, what = "Mcp-Method", message.method, "its method"
    elif isinstance(value, str) and MCP_NAME_HEADER.encode() not in headers:
        missing, what = "Mcp-Name", f"its `{key}`"
    else:
        return None
    shown = f" ({missing}: {value})" if value.isascii() and value.isprintable() and len(value) <= 80 else ""
    return Refusal(HEADER_MISMATCH, f"the {missing} header is missing: a 2026-07-28 {message.method[:40]} request "
                   f"names {what} in it too{shown}", message.id)


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header `name` (lower case) in `scope`, or None."""
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def _not_allowed(scope: Scope) -> str:
    return (f"Method Not Allowed: {str(scope.get('method'))[:16]} with MCP-Protocol-Version "
            f"{(header(scope, b'mcp-protocol-version') or '')[:40]!r}: that version takes only a POST of one JSON-RPC "
            "message (GET event streams and DELETE belong to 2025-11-25 sessions)")


def _not_acceptable(scope: Scope) -> str:
    return ("Not Acceptable: list both application/json and text/event-stream in the Accept header "
            f"(it was {(header(scope, b'accept') or '')[:80]!r})")


_BARE = {405: _not_allowed, 406: _not_acceptable}
MISSING_SESSION = "Bad Request: Missing session ID"
# The SDK's terse 400s, as it words them -> what they say here.
_TERSE = {MISSING_SESSION: MISSING_SESSION + ": a 2025-11-25 request other than initialize carries the "
          "Mcp-Session-Id header of initialize's answer; send initialize first, then that header on every "
          "later request (or send MCP-Protocol-Version: 2026-07-28 on each request, which needs no session)"}


def _told(body: bytes) -> bytes | None:
    """The SDK's JSON-RPC error `body` with one of its _TERSE messages said in full; None for
    any other body."""
    if not any(terse.encode() in body for terse in _TERSE):
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict) or error.get("message") not in _TERSE:
        return None
    error["message"] = _TERSE[error["message"]]
    return json.dumps(answer).encode()


def explain_bare(scope: Scope, send: Send) -> Send:
    """`send` for the SDK's answer to `scope`: a 405 or 406 that it sends with an empty body
    (its 2026-07-28 transport does) gets the JSON-RPC error saying what to send instead, as
    every other refusal here does, and a 400 in the SDK's few words (_TERSE) says them in
    full. Its other headers (Allow) are kept."""
    held: Message | None = None

    async def explained(message: Message) -> None:
        nonlocal held
        if message["type"] == "http.response.start" and message.get("status") in (*_BARE, 400):
            held = message
            return
        start, held = held, None
        body: bytes | None = None
        if start is not None and message["type"] == "http.response.body" and not message.get("more_body"):
            if start["status"] in _BARE and not message.get("body"):
                body = bytes(json_error(start["status"], _BARE[start["status"]](scope)).body)
            elif start["status"] == 400:
                body = _told(message.get("body", b""))
        if start is None or body is None:
            if start is not None:
                await send(start)
            await send(message)
            return
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length", b"content-type")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return explained


__all__ = ["explain_bare", "header", "json_error", "screen_body"]
