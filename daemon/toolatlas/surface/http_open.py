"""The HTTP requests being served, by the credential that let each in, so that a reload
which removes the credential ends them at once.

Every request is admitted anew (surface.http), but a request being served can last: a
2025-11-25 session's GET event stream, a 2026-07-28 `subscriptions/listen` stream, a long
tools/call. Without this, such a stream opened with a token the operator then removed (or
rotated) went on carrying the upstreams' notifications until the client left.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Scope, Send

from toolatlas.gateway.ports import Connection


class OpenRequests:
    """The requests in flight, each with the cancel scope that ends it."""

    def __init__(self) -> None:
        self._open: dict[anyio.CancelScope, tuple[Connection, Scope]] = {}
        self._held: dict[str, int] = {}  # principal -> its requests in flight

    def over_share(self, principal: str, share: int) -> Response | None:
        """The 429 for a request of `principal` when it has `share` requests in flight already
        (event streams included), else None: one token (or the anonymous principal) cannot
        hold every connection the endpoint serves ([daemon] max_clients), which would leave
        everyone else 503."""
        if self._held.get(principal, 0) < share:
            return None
        message = (f"{principal} already has {share} requests in flight on this endpoint (event streams "
                   "included; [daemon] max_clients_per_uid): end one, then retry")
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}},
                            status_code=429, headers={"Retry-After": "1"})

    @asynccontextmanager
    async def serving(self, conn: Connection, scope: Scope, send: Send, *,
                      until: float | None = None) -> AsyncIterator[Send]:
        """Serve one request inside this block, through the `send` it yields; `end_revoked`
        may cancel it, and so does the time `until` (Unix seconds: when the OAuth token an
        event stream was opened with expires). A cancelled response is finished here: a
        started one (an event stream) ends cleanly, one not yet started is answered 401."""
        done = {"started": False, "complete": False, "released": False}
        principal = conn.principal

        def release() -> None:  # at the answer's end: its client may send the next request before we return
            if not done["released"]:
                done["released"] = True
                if (left := self._held.pop(principal) - 1) > 0:
                    self._held[principal] = left

        async def tracking(message: Message) -> None:
            if message["type"] == "http.response.start":
                done["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                done["complete"] = True
                release()
            await send(message)

        deadline = math.inf if until is None else anyio.current_time() + until - time.time()
        with anyio.CancelScope(deadline=deadline) as cancel:
            self._open[cancel] = (conn, scope)
            self._held[principal] = self._held.get(principal, 0) + 1
            try:
                yield tracking
            finally:
                self._open.pop(cancel, None)
                release()
        if not cancel.cancelled_caught or done["complete"]:
            return
        if done["started"]:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": REVOKED}}
            await JSONResponse(body, status_code=401)(scope, _nothing, send)

    def end_revoked(self, *, token_name: Callable[[str], str | None], anonymous: str,
                    oauth: Callable[[str, Scope], bool]) -> int:
        """Cancel every request whose credential is no longer accepted (`still_admitted`); how many."""
        ended = [cancel for cancel, (conn, scope) in self._open.items()
                 if not still_admitted(conn, scope, token_name=token_name, anonymous=anonymous, oauth=oauth)]
        for cancel in ended:
            cancel.cancel()
        return len(ended)


def still_admitted(conn: Connection, scope: Scope, *, token_name: Callable[[str], str | None], anonymous: str,
                   oauth: Callable[[str, Scope], bool]) -> bool:
    """Whether the credential a request in flight came with is still accepted, as surface.http
    admits one: its bearer token's name (`token_name`, from the token table) is the one it
    came in as, or it had no Authorization and is still the `anonymous` principal; for an
    OAuth token, `oauth(token, scope)` (the issuer's current settings still accept it)."""
    auth = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"authorization"), "")
    scheme, _, presented = auth.partition(" ")
    if conn.oauth is not None:
        return scheme.lower() == "bearer" and oauth(presented.strip(), scope)
    if not scheme:
        return bool(anonymous) and conn.token == anonymous
    return scheme.lower() == "bearer" and token_name(presented.strip()) == conn.token


REVOKED = "the credential this request was made with is no longer accepted (a reload removed it, or it expired)"


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


__all__ = ["OpenRequests", "REVOKED", "still_admitted"]
