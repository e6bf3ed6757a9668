"""A streamable-HTTP upstream's POSTs still waiting for their answer's headers, and the end
of one whose caller gave up.

`bounded.Abandon` ends the event stream of an abandoned request once its headers have come.
A tool that hangs without sending even those left its POST waiting until the client's read
timeout (300 s or more), holding one of the client's 100 pooled connections: a hundred calls
given up at their timeout and every request of the session waited for a connection, until
the session failed with "PoolTimeout", all its calls with it. `Posts.abandon` now also
cancels such a POST where it waits (`AbandonableTransport`), which closes its connection; the
SDK is handed an answer that no one waits for any more. A connection that breaks under one
request before its answer began fails that request, not the session (`_BROKE`).
"""

from __future__ import annotations

import logging

import anyio
import httpx2
import mcp_types

from toolatlas.upstream.bounded import Abandon, RequestId, posted_id
from toolatlas.upstream.client import STAND_IN, describe

logger = logging.getLogger(__name__)


class Posts(Abandon):
    """`Abandon`, and the requests whose POST waits for its headers, by request id."""

    def __init__(self) -> None:
        super().__init__()
        self._waiting: dict[RequestId, anyio.CancelScope] = {}

    def waiting(self, request_id: RequestId, scope: anyio.CancelScope) -> None:
        self._waiting[request_id] = scope

    def answered(self, request_id: RequestId, scope: anyio.CancelScope) -> None:
        if self._waiting.get(request_id) is scope:
            del self._waiting[request_id]

    def abandon(self, request_id: RequestId) -> None:
        scope = self._waiting.pop(request_id, None)
        if scope is not None:
            scope.cancel()
            return
        super().abandon(request_id)


# A connection that breaks under one request, after it was sent: that request fails, not the
# session (the SDK's POST task raised it, which ended the whole session and every call on it).
# A connection that cannot be made (the server is down) still ends the session.
_BROKE = (httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError, httpx2.ReadTimeout, httpx2.WriteTimeout)


class AbandonableTransport(httpx2.AsyncBaseTransport):
    """The client's transport, with each request's wait for its answer's headers registered
    in `posts`, so that `Posts.abandon` can end it; a request whose connection breaks before
    its answer began is answered with an error saying so (`_BROKE`)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, posts: Posts, name: str) -> None:
        self._inner, self._posts, self._name = inner, posts, name

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request_id = posted_id(request)
        if request_id is None:
            return await self._inner.handle_async_request(request)
        with anyio.CancelScope() as scope:
            self._posts.waiting(request_id, scope)
            try:
                return await self._inner.handle_async_request(request)
            except _BROKE as exc:
                logger.warning("upstream %s: the connection broke before an answer began: %r", self._name, exc)
                return _answer(request, request_id, f"the connection to upstream {self._name!r} broke before its "
                               f"answer began ({describe(exc)}); the call may or may not have run")
            finally:
                self._posts.answered(request_id, scope)
        # Given up by its caller: the connection is closed; the answer goes to no one.
        return _answer(request, request_id, "the caller gave up on this request before its answer began")

    async def aclose(self) -> None:
        await self._inner.aclose()


def _answer(request: httpx2.Request, request_id: RequestId, message: str) -> httpx2.Response:
    error = mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id,  # toolatlas's words (STAND_IN), not the upstream's
                                   error=mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message=message,
                                                             data=dict(STAND_IN)))
    return httpx2.Response(200, headers={"content-type": "application/json"}, request=request,
                           content=error.model_dump_json(by_alias=True, exclude_unset=True).encode())


__all__ = ["AbandonableTransport", "Posts"]
