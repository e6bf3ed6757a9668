"""The 2025-11-25 sessions each principal holds on the HTTP endpoint, so that one cannot take
them all.

The SDK's session manager bounds sessions only in total (10 000, each a task and some 40 KB,
ended after `SESSION_IDLE_S` with no request): one token opening sessions and never ending
them (a leaky client, or anyone holding any token) filled that, and then every other client's
`initialize` got 503 for half an hour. Here a principal keeps at most its share (`[daemon]
max_clients_per_uid`, as a uid's socket connections): opening one more first ends its least
recently used idle session (the DELETE its client could have sent), and when every one of its
sessions has a request in flight (an open event stream) the opening request gets 429.

Also: a session's request whose event stream ended before its answer (the client went away,
the session was ended) is cancelled in the session (`answer_or_cancel`). The SDK
keeps it running, as the spec lets a client resume a stream; with no event store nothing can
resume it, and the upstream call ran on to its end for no one.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import mcp_types as types
import msgspec
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Seconds a session with no request in flight lives (given to the SDK's manager, which ends it).
SESSION_IDLE_S = 1800.0
# Seconds the cancel of a request whose answer did not go out may take (answer_or_cancel).
CANCEL_S = 5.0


class SessionLedger:
    """Open sessions by principal, least recently used first, with their requests in flight."""

    def __init__(self) -> None:
        self._by: dict[str, OrderedDict[str, None]] = {}  # principal -> its session ids, LRU first
        self._owner: dict[str, str] = {}  # session id -> principal
        self._busy: dict[str, int] = {}  # session id -> requests in flight on it
        self._seen: dict[str, float] = {}  # session id -> when its last request ended (monotonic)

    def __len__(self) -> int:
        return len(self._owner)

    def opened(self, session_id: str, principal: str) -> None:
        self._owner[session_id] = principal
        self._by.setdefault(principal, OrderedDict())[session_id] = None
        self._seen[session_id] = time.monotonic()

    def closed(self, session_id: str) -> None:
        principal = self._owner.pop(session_id, None)
        self._busy.pop(session_id, None)
        self._seen.pop(session_id, None)
        mine = self._by.get(principal or "")
        if mine is not None:
            mine.pop(session_id, None)
            if not mine:
                del self._by[principal or ""]

    @contextmanager
    def using(self, session_id: str, principal: str) -> Iterator[None]:
        """Around a request on `session_id` made by `principal` (another principal's is refused
        by the SDK and changes nothing here)."""
        if self._owner.get(session_id) != principal:
            yield
            return
        self._by[principal].move_to_end(session_id)
        self._busy[session_id] = self._busy.get(session_id, 0) + 1
        try:
            yield
        finally:
            if session_id in self._owner:
                self._busy[session_id] -= 1
                self._seen[session_id] = time.monotonic()

    def make_room(self, principal: str, share: int) -> list[str] | None:
        """The idle sessions of `principal` to end so that one more fits in `share`, least
        recently used first (sessions the SDK has idled out are forgotten on the way); None
        when too many of them have a request in flight."""
        now = time.monotonic()
        for sid in [s for s in self._by.get(principal, ()) if self._expired(s, now)]:
            self.closed(sid)
        mine = list(self._by.get(principal, ()))
        excess = len(mine) - share + 1
        if excess <= 0:
            return []
        idle = [sid for sid in mine if not self._busy.get(sid)][:excess]
        return idle if len(idle) == excess else None

    def _expired(self, session_id: str, now: float) -> bool:
        return not self._busy.get(session_id) and now - self._seen.get(session_id, now) >= SESSION_IDLE_S

    def watch(self, send: Send, session_id: str | None, principal: str, method: str,
              on_open: Callable[[str], None] | None = None) -> Send:
        """`send`, noting what the answer means for the ledger: a session opened (an
        `Mcp-Session-Id` on a success without one asked for; `on_open` gets its id too),
        ended by its DELETE, or unknown to the SDK (404: it idled out). A refused request without a session id loses the
        `Mcp-Session-Id` the SDK puts on it: that session was discarded with the refusal, and
        a client keeping the id (the TypeScript SDK keeps one from any answer) would send it
        with every later request, its next initialize included, and get 404 each time."""

        async def watching(message: Message) -> None:
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 500))
                if session_id is None and status >= 400:
                    message = {**message, "headers": [(k, v) for k, v in message.get("headers", [])
                                                      if k.lower() != b"mcp-session-id"]}
                if session_id is None and status < 400:
                    for key, value in message.get("headers", []):
                        if key.lower() == b"mcp-session-id":
                            self.opened(sid := value.decode("latin-1"), principal)
                            if on_open is not None:
                                on_open(sid)
                elif session_id is not None and self._owner.get(session_id) == principal and (
                        status == 404 or (method == "DELETE" and status < 300)):
                    self.closed(session_id)
            await send(message)

        return watching


def too_many_sessions(principal: str, share: int) -> Response:
    message = (f"{principal} already has {share} sessions open, each with a request in flight "
               "([daemon] max_clients_per_uid): end one (DELETE with its Mcp-Session-Id), then retry")
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}},
                        status_code=429, headers={"Retry-After": "1"})


class _Answered:
    """The `send` of a session's POST, noting whether the answer to its request `request_id`
    went out on the event stream (a `data:` line holding a JSON-RPC result or error for it).
    An event stream that ends without it (the session was ended: its DELETE) gets an error
    event for the request first, so the client is told why and what to do."""

    def __init__(self, send: Send, request_id: str | int) -> None:
        self._send, self.request_id = send, request_id
        self.seen = self._stream = False

    async def __call__(self, message: Message) -> None:
        if message.get("type") == "http.response.start":
            self._stream = message.get("status") == 200 and any(
                k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in message.get("headers", []))
        elif not self.seen and message.get("type") == "http.response.body":
            self.seen = _answers(message.get("body", b""), self.request_id)
            if not self.seen and self._stream and not message.get("more_body"):
                error = {"code": -32000, "message": ENDED}
                data = msgspec.json.encode({"jsonrpc": "2.0", "id": self.request_id, "error": error})
                await self._send({"type": "http.response.body", "body": b"event: message\r\ndata: " + data + b"\r\n\r\n",
                                  "more_body": True})
        await self._send(message)


ENDED = ("the session ended before this request was answered (a DELETE of its Mcp-Session-Id, or the daemon "
         "stopping), and its call was cancelled: open a new session and send the request again")


def _answers(chunk: bytes, request_id: str | int) -> bool:
    for line in chunk.splitlines():
        if not line.startswith(b"data:"):
            continue
        try:
            msg = msgspec.json.decode(line[5:])
        except (msgspec.DecodeError, RecursionError):
            continue
        if isinstance(msg, dict) and msg.get("id") == request_id and ("result" in msg or "error" in msg):
            return True
    return False


async def answer_or_cancel(app: ASGIApp, scope: Scope, receive: Receive, send: Send, session_id: str | None,
                           message: object) -> None:
    """Serve the request through the SDK's manager (`app`); a session's request whose answer
    did not go out on its event stream (module docstring) is then cancelled in its session,
    as its client's notifications/cancelled would, shielded and bounded."""
    if not session_id or not isinstance(message, types.JSONRPCRequest):
        await app(scope, receive, send)
        return
    answered = _Answered(send, message.id)
    try:
        await app(scope, receive, answered)
    finally:
        if not answered.seen:
            body = msgspec.json.encode({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {
                "requestId": message.id, "reason": "the request's event stream ended before its answer"}})
            version = [(k, v) for k, v in scope.get("headers", []) if k.lower() == b"mcp-protocol-version"]
            with anyio.move_on_after(CANCEL_S, shield=True), contextlib.suppress(Exception):  # (the daemon stopping)
                await _inject(app, {**scope, "method": "POST", "query_string": b"", "headers": [
                    (b"mcp-session-id", session_id.encode("latin-1")), (b"content-type", b"application/json"),
                    (b"accept", b"application/json, text/event-stream"), *version]}, body)


async def end_session(app: ASGIApp, session_id: str, scope: Scope) -> None:
    """End a session through the SDK's manager (`app`) as its client's DELETE would; `scope`
    is a request of the session's principal (its `user` is what the SDK checks)."""
    headers = [(b"mcp-session-id", session_id.encode("latin-1"))]
    await _inject(app, {**scope, "method": "DELETE", "headers": headers, "query_string": b""}, b"")


async def _inject(app: ASGIApp, scope: Scope, body: bytes) -> None:
    """Run a request of our own making through `app`; its answer is dropped."""

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def discard(_message: Message) -> None:
        pass

    await app(scope, receive, discard)


__all__ = ["SESSION_IDLE_S", "SessionLedger", "answer_or_cancel", "end_session", "too_many_sessions"]
