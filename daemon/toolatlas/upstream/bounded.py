"""``max_result_bytes`` for the HTTP transports: every reply is counted while it is read;
``max_result_blocks`` for every transport (``too_many_blocks``, ``blocks_refusal``); a reply
that is not valid JSON-RPC fails the request it names (``invalid_response``, stdio and SSE).

``limit_hook(up)`` is an httpx2 response hook for an upstream's client. It wraps the body of
each response before the SDK reads it:

- an event stream (the SSE transport's GET stream, a streamable-HTTP POST's or GET's stream)
  is passed on one whole event at a time (``BoundedEvents``); an event past the limit is
  dropped as it streams in and replaced at once by an error event for the request it answers,
  and the stream goes on, so the session stays up;
- any other body (a streamable-HTTP POST's JSON reply) is held up to the limit, as the SDK
  reads it whole anyway; past it, reading stops and the body becomes that request's error.
  A connection that breaks while such a body is read fails that request the same way
  (``broken``): the SDK would otherwise end the whole session over one cut reply, and every
  other call in flight on it with it.

A compressed body is counted after decoding. The error is the one the stdio transport gives
(``refusal``), so a caller sees the same message whatever the transport.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Self

import anyio
import httpx2
import mcp_types
import msgspec
from mcp.shared._stream_protocols import WriteStream
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import SessionMessage

from toolatlas.config import HttpUpstream, SseUpstream, Upstream
from toolatlas.jsonlines import MAX_DEPTH, BoundedLines, Oversized, deeper_than, is_request_id, request_id_of
from toolatlas.upstream.client import STAND_IN, describe

logger = logging.getLogger(__name__)

HEAD = BoundedLines.HEAD
RequestId = str | int


def _error(request_id: RequestId, message: str) -> mcp_types.JSONRPCError:
    """toolatlas's stand-in for the reply to `request_id` (marked, so no one reads it as the upstream's)."""
    return mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id,
                                  error=mcp_types.ErrorData(code=-32603, message=message, data=dict(STAND_IN)))


def refusal(up: Upstream, request_id: RequestId) -> mcp_types.JSONRPCError:
    """The JSON-RPC error that answers a request whose result was over ``max_result_bytes``."""
    return _error(request_id, f"the result from upstream {up.name!r} is larger than max_result_bytes "
                              f"({up.max_result_bytes} bytes) and was refused")


def broken(up: Upstream, request_id: RequestId, exc: httpx2.TransportError) -> mcp_types.JSONRPCError:
    """The JSON-RPC error that answers a request whose reply was cut off by the connection."""
    return _error(request_id, f"the connection to upstream {up.name!r} broke while its reply was being read "
                              f"({describe(exc)}); the call may or may not have run")


# The fewest bytes a content block takes in JSON (`{"type":"text"}` and a comma).
_MIN_BLOCK_BYTES = 16


def blocks_refusal(up: Upstream, request_id: RequestId, blocks: int) -> mcp_types.JSONRPCError:
    """The JSON-RPC error that answers a request whose result had over ``max_result_blocks``."""
    logger.warning("upstream %s: refused a result of %d content blocks (limit %d)", up.name, blocks, up.max_result_blocks)
    return _error(request_id, f"the result from upstream {up.name!r} has {blocks} content blocks, more than "
                              f"max_result_blocks ({up.max_result_blocks}), and was refused")


class _Block(msgspec.Struct):
    pass  # decoded without its fields: only the count matters


class _Result(msgspec.Struct):
    content: list[_Block] | None = None


class _Reply(msgspec.Struct):
    id: int | str | None = None
    result: _Result | None = None


_count_blocks = msgspec.json.Decoder(_Reply).decode


def too_many_blocks(up: Upstream, line: bytes) -> mcp_types.JSONRPCError | None:
    """For a raw stdout line: a refusal when it is a result with more than max_result_blocks
    content blocks, counted before any model is built (pydantic took seconds on 400,000)."""
    if len(line) <= up.max_result_blocks * _MIN_BLOCK_BYTES:
        return None
    try:
        reply = _count_blocks(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # not a tool result's shape: the normal parse decides
    content = reply.result.content if reply.result is not None else None
    if content is None or len(content) <= up.max_result_blocks or reply.id is None:
        return None
    return blocks_refusal(up, reply.id, len(content))


_decode_plain = msgspec.json.Decoder().decode


def response_problem(msg: dict[str, Any]) -> str | None:
    """What makes `msg`, a decoded JSON-RPC response (an `id`, a `result` or an `error`), not
    valid JSON-RPC for MCP, or None when it is valid."""
    error = msg.get("error")
    if msg.get("jsonrpc") != "2.0":
        return 'its `jsonrpc` is not "2.0"'
    if error is None:
        result = msg.get("result")
        return None if isinstance(result, dict) else f"its result is {type(result).__name__}, not an object"
    if not isinstance(error, dict):
        return f"its error is {type(error).__name__}, not an object"
    if missing := [f"`{key}`" for key in ("code", "message") if key not in error]:
        return f"its error has no {' or '.join(missing)}"
    code, message = error["code"], error["message"]
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
        return "its error's `code` is not an integer or its `message` not a string"
    return None


def invalid(request_id: RequestId, problem: str) -> mcp_types.JSONRPCError:
    """The JSON-RPC error that answers a request whose response was not valid JSON-RPC."""
    return _error(request_id, f"the upstream's response is not valid JSON-RPC: {problem}")


def invalid_response(data: bytes | str) -> mcp_types.JSONRPCError | None:
    """For a message that failed JSON-RPC validation: the error for the request it answers
    when it names one (an `id`, a `result` or an `error`, no `method`), else None (it is
    logged as garbage). Without it the SDK drops the message, and the request waits out its
    timeout to be told the upstream "did not answer"."""
    try:
        msg = _decode_plain(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(msg, dict) or "method" in msg or not ("result" in msg or "error" in msg):
        return None
    request_id = msg.get("id")
    if not is_request_id(request_id):
        return None
    # Well formed, yet the SDK's parser refused it: pydantic-core reads at most MAX_DEPTH levels.
    problem = response_problem(msg) or (f"it nests deeper than the {MAX_DEPTH} levels the MCP SDK reads"
                                        if deeper_than(msg, MAX_DEPTH) else None)
    return None if problem is None else invalid(request_id, problem)


def _head(parts: list[bytes]) -> bytes:
    """The first HEAD bytes of ``parts`` joined (without joining them all)."""
    head = bytearray()
    for part in parts:
        head += part[: HEAD - len(head)]
        if len(head) >= HEAD:
            break
    return bytes(head)


def sse_event_limit(up: SseUpstream | HttpUpstream) -> int:
    """The SDK parser's event size limit behind a ``limit_hook``: never the one that trips
    (events reach it at most ``max_result_bytes`` raw bytes long), but a backstop. A raw byte
    decodes to at most 3 UTF-8 bytes (U+FFFD for an invalid one)."""
    return 3 * up.max_result_bytes


class BoundedEvents:
    """Splits a server-sent-event byte stream into whole events, never holding more than
    ``limit`` bytes of one.

    ``feed(chunk)`` returns the events the chunk completed, each with its ending blank line
    (line ends normalised to ``\\n``). An event that grows past the limit comes out as one
    ``Oversized`` the moment it crosses, with the JSON-RPC id read off its first ``HEAD``
    bytes; the rest of it is skipped as it streams in, and the stream goes on after it.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._skipping = False
        self._cr = False  # the last chunk ended in "\r": maybe half of a "\r\n"
        self._nl = False  # the event so far ends in "\n": a leading "\n" ends it

    def feed(self, data: bytes) -> list[bytes | Oversized]:
        if self._cr:
            data = b"\r" + data
        self._cr = data.endswith(b"\r")
        if self._cr:
            data = data[:-1]
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        out: list[bytes | Oversized] = []
        pos = 0
        while pos < len(data):
            if self._nl and data[pos] == 0x0A:
                end = pos + 1
            else:
                i = data.find(b"\n\n", pos)
                end = -1 if i < 0 else i + 2
            piece = data[pos:] if end < 0 else data[pos:end]
            self._take(piece, out)
            self._nl = end < 0 and piece.endswith(b"\n")
            if end < 0:
                break
            self._finish(out)
            pos = end
        return out

    def _take(self, piece: bytes, out: list[bytes | Oversized]) -> None:
        if self._skipping:
            return
        self._size += len(piece)
        if self._size > self.limit:
            out.append(Oversized(self._size, request_id_of(_head([*self._parts, piece]))))
            self._parts, self._skipping = [], True
            return
        self._parts.append(piece)

    def _finish(self, out: list[bytes | Oversized]) -> None:
        if not self._skipping:
            out.append(b"".join(self._parts))
        self._parts, self._size, self._skipping = [], 0, False


def _wire(error: mcp_types.JSONRPCError) -> bytes:
    """`error` as the bytes of a reply body, in place of the one it answers."""
    return error.model_dump_json(by_alias=True, exclude_unset=True).encode()


def posted_id(request: httpx2.Request) -> RequestId | None:
    """The id of the JSON-RPC request a POST carried (its reply answers that one)."""
    if request.method != "POST":
        return None
    try:
        return request_id_of(request.content[:HEAD])
    except httpx2.RequestNotRead:
        return None


class Abandon:
    """The event streams answering requests on one upstream client, by the request each answers.

    `abandon(id)` ends the one whose caller gave up. The SDK keeps reading a 2025-era POST's
    stream after it sent the courtesy `notifications/cancelled` (on that revision a closed
    stream is not a cancel); a server whose tool is stuck ignores the cancel and keeps the
    stream open, and each such stream held one of the client's 100 pooled connections until
    the next request's pool timeout ended the whole session. An abandoned stream now ends as
    a broken one (`httpx2.SSEError`), which the SDK settles without reconnecting to it."""

    # Requests given up before their answer's headers came: their stream ends as it starts.
    EARLY = 256

    def __init__(self) -> None:
        self._reading: dict[RequestId, _Bounded] = {}
        self._early: OrderedDict[RequestId, None] = OrderedDict()

    def add(self, request_id: RequestId, body: _Bounded) -> None:
        if self._early.pop(request_id, 0) is None:
            body.abandon()
            return
        self._reading[request_id] = body

    def discard(self, request_id: RequestId, body: _Bounded) -> None:
        if self._reading.get(request_id) is body:
            del self._reading[request_id]

    def abandon(self, request_id: RequestId) -> None:
        body = self._reading.pop(request_id, None)
        if body is not None:
            body.abandon()
            return
        self._early[request_id] = None
        while len(self._early) > self.EARLY:
            self._early.popitem(last=False)


class Proxy:
    """Delegates to `_inner`: `aclose`, `async with`, and every attribute it does not define."""

    _inner: Any

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CancelWatch(Proxy):
    """A session's write stream that tells `Abandon` of each `notifications/cancelled` it sends."""

    _inner: WriteStream[SessionMessage]

    def __init__(self, inner: WriteStream[SessionMessage], streams: Abandon) -> None:
        self._inner, self._streams = inner, streams

    async def send(self, item: SessionMessage, /) -> None:
        await self._inner.send(item)
        msg = item.message
        if isinstance(msg, mcp_types.JSONRPCNotification) and msg.method == "notifications/cancelled":
            request_id = cancelled_request_id_from_params(msg.params)
            if request_id is not None:
                self._streams.abandon(request_id)


class _Bounded(httpx2.AsyncByteStream):
    """A response body read through ``max_result_bytes`` (see the module docstring), and
    ended early when it answers a request its caller abandoned (`Abandon`)."""

    def __init__(self, up: Upstream, response: httpx2.Response, body: httpx2.AsyncByteStream,
                 streams: Abandon | None = None) -> None:
        self._up, self._body = up, body
        self._posted = posted_id(response.request)
        content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        self._events = content_type == "text/event-stream"
        self._streams = streams if self._events and self._posted is not None else None
        self._abandoned = False
        self._reading: anyio.CancelScope | None = None
        if self._streams is not None and self._posted is not None:
            self._streams.add(self._posted, self)

    @property
    def raw(self) -> httpx2.AsyncByteStream:  # the body unbounded, for a reader that takes only its start
        return self._body

    def abandon(self) -> None:
        self._abandoned = True
        if self._reading is not None:
            self._reading.cancel()

    async def _next(self, chunks: AsyncIterator[bytes]) -> bytes | None:
        """The next chunk, None at the end; httpx2.SSEError once the request is abandoned."""
        with anyio.CancelScope() as self._reading:  # never around a yield: only this read
            if not self._abandoned:
                try:
                    return await chunks.__anext__()
                except StopAsyncIteration:
                    return None
        raise httpx2.SSEError(f"toolatlas closed the stream: the caller gave up on request {self._posted!r}")

    def _refusal(self, request_id: RequestId | None) -> bytes | None:
        logger.warning("upstream %s: refused a message larger than max_result_bytes (%d bytes)",
                       self._up.name, self._up.max_result_bytes)
        request_id = self._posted if request_id is None else request_id
        if request_id is None:
            return None
        return _wire(refusal(self._up, request_id))

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._body.__aiter__()
        pieces = self._event_pieces(chunks) if self._events else self._whole(chunks)
        try:
            async for piece in pieces:
                yield piece
        finally:
            if self._streams is not None and self._posted is not None:
                self._streams.discard(self._posted, self)
            await pieces.aclose()
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                # What was read is what the SDK gets: a connection failing as it is let go
                # (a body refused half-read is cut off) must not turn it into an exception.
                with contextlib.suppress(httpx2.TransportError):
                    await aclose()

    async def _event_pieces(self, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        events = BoundedEvents(self._up.max_result_bytes)
        while (chunk := await self._next(chunks)) is not None:
            for event in events.feed(chunk):
                if not isinstance(event, Oversized):
                    yield event
                elif (error := self._refusal(event.request_id)) is not None:
                    yield b"event: message\ndata: " + error + b"\n\n"

    async def _whole(self, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        parts: list[bytes] = []
        size = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > self._up.max_result_bytes:
                    error = self._refusal(request_id_of(_head([*parts, chunk])))
                    if error is not None:
                        yield error
                    return  # stop reading: this body holds this one reply
                parts.append(chunk)
        except httpx2.TransportError as exc:
            if self._posted is None:
                raise
            logger.warning("upstream %s: the connection broke while a reply was being read: %r", self._up.name, exc)
            yield _wire(broken(self._up, self._posted, exc))
            return
        for part in parts:
            yield part

    async def aclose(self) -> None:
        with contextlib.suppress(httpx2.TransportError):
            await self._body.aclose()


class _Decoded(httpx2.AsyncByteStream):
    """A compressed body, decoded by httpx2 itself (a response of its own over the raw stream)."""

    def __init__(self, encoding: str, raw: httpx2.AsyncByteStream) -> None:
        self._response = httpx2.Response(200, headers={"content-encoding": encoding}, stream=raw)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_bytes():
            yield chunk

    async def aclose(self) -> None:
        await self._response.aclose()


def limit_hook(up: SseUpstream | HttpUpstream,
               streams: Abandon | None = None) -> Callable[[httpx2.Response], Awaitable[None]]:
    """An httpx2 response hook that reads every body of ``up``'s client through its limit
    (and, with ``streams``, ends the event streams of abandoned requests)."""

    async def hook(response: httpx2.Response) -> None:
        body = response.stream
        assert isinstance(body, httpx2.AsyncByteStream)  # an AsyncClient's response
        encoding = response.headers.get("content-encoding", "")
        if encoding.strip().lower() not in ("", "identity"):
            # Count what the SDK will hold, not what came over the wire: decode here, once.
            body = _Decoded(encoding, body)
            del response.headers["content-encoding"]
        response.stream = _Bounded(up, response, body, streams)

    return hook


__all__ = ["Abandon", "BoundedEvents", "posted_id", "CancelWatch", "Proxy", "blocks_refusal", "invalid", "invalid_response", "limit_hook", "refusal", "response_problem",
           "sse_event_limit", "too_many_blocks"]
