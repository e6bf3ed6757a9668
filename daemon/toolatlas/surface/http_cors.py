"""CORS for browser clients of the HTTP endpoint, at the origins `[http] allowed_origins` lists.

A page at another origin than the endpoint's (a web MCP client; the MCP Inspector, which also
runs its OAuth discovery in the browser) first sends a preflight OPTIONS, which never carries
Authorization, and can then read an answer only when it names the page's origin and exposes
`Mcp-Session-Id`. Without these a listed origin got 401 on the preflight, and the browser
refused every request. Origins not listed get 403 before any of this (surface.http).
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import Message, Send

METHODS = "GET, POST, DELETE, OPTIONS"
# What a client sends (the 2026-07-28 Mcp-Param-* headers vary per tool: the preflight's
# own Access-Control-Request-Headers are allowed back, the origin being allowed anyway).
HEADERS = ("authorization, content-type, accept, last-event-id, mcp-session-id, mcp-protocol-version, "
           "mcp-method, mcp-name")
EXPOSED = b"mcp-session-id, mcp-protocol-version, www-authenticate"


def preflight(origin: str | None, requested_headers: str | None) -> Response:
    """The answer to an OPTIONS: 204 with what an allowed `origin` may send (the caller has
    checked it, and names it through `with_cors`), or just `Allow` when no Origin came."""
    headers = {"Allow": METHODS}
    if origin is not None:
        headers |= {"Access-Control-Allow-Methods": METHODS, "Access-Control-Max-Age": "600",
                    "Access-Control-Allow-Headers": (requested_headers or HEADERS)[:2000]}
    return Response(status_code=204, headers=headers)


def with_cors(send: Send, origin: str) -> Send:
    """`send`, its answer readable by a page at the allowed `origin`."""
    extra = [(b"access-control-allow-origin", origin.encode("latin-1")),
             (b"access-control-expose-headers", EXPOSED), (b"vary", b"Origin")]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending


__all__ = ["preflight", "with_cors"]
