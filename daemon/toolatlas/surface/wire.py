"""Newline-delimited JSON-RPC over any anyio byte stream, as MCP read/write streams.

The SDK's stdio transport silently drops lines it cannot parse; a gateway must answer them.
Every line is screened by surface.rpccheck: a malformed one gets the JSON-RPC error it
earns (-32700, -32600 or -32602, saying what to send instead), and a line over `max_bytes`
is discarded up to its newline and answered with -32600 naming the limit, with the id read
off its start. None of them ends the connection; an empty line is skipped, a UTF-8
byte order mark before a line dropped (JSON parsers may ignore one; the shim's does), and
a last line without its newline, from a peer that half-closed, still read.

A connection has at most `max_in_flight` requests read and not yet answered; past that a
request is answered at once with -32000 saying so. Each request in flight is a task holding
its answer until the peer reads it: a peer that pipelines requests without reading replies
would otherwise grow the daemon without bound (100,000 searches held 800 MB).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import msgspec
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

from toolatlas.jsonlines import BoundedLines, Oversized, is_request_id
from toolatlas.surface.admin import ADMIN_PREFIX
from toolatlas.surface.rpccheck import INTERNAL_ERROR, INVALID_REQUEST, Refusal, screen

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
# Requests one connection may have in flight (read, their reply not yet sent) at once.
MAX_IN_FLIGHT = 256
SERVER_ERROR = -32000
_CHUNK = 65536
_BOM = b"\xef\xbb\xbf"
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

# lane(request, send): the JSON-RPC response, an awaitable of it, or None (see ndjson_streams).
Lane = Callable[[dict[str, Any], Callable[[bytes], Awaitable[None]]],
                "dict[str, Any] | Awaitable[dict[str, Any]] | None"]
# admin(id, method, params): the JSON-RPC response to an operator request (surface.admin).
Admin = Callable[[str | int, str, dict[str, Any] | None], Awaitable[dict[str, Any]]]


class _Owed:
    """Requests handed to the SDK and not yet answered, by id: the SDK answers each once, or
    not at all once the peer cancels it. "7" and 7 are one id, as the SDK correlates them."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._listens: set[str] = set()  # subscriptions/listen streams: answered only when they end
        self.count = 0

    def add(self, id_: Any, *, listen: bool = False) -> None:
        key = str(id_)
        self._ids[key] = self._ids.get(key, 0) + 1
        self.count += 1
        if listen:
            self._listens.add(key)

    @property
    def replies_due(self) -> int:
        """Of those, the requests answered before the connection ends (not listen streams)."""
        return self.count - len(self._listens)

    def settle(self, id_: Any) -> None:
        key = str(id_)
        left = self._ids.get(key, 0) - 1
        if left < 0:
            return  # a reply to a request already settled (a late cancel), or never counted
        self.count -= 1
        if left:
            self._ids[key] = left
        else:
            del self._ids[key]
        self._listens.discard(key)


def _request_id(line: bytes) -> tuple[bool, Any]:
    """(whether `line` is a request, its id): a message with a method and a valid id."""
    try:
        msg = _decode(line)
    except Exception:  # noqa: BLE001 - not JSON: the screen answers it
        return False, None
    if not isinstance(msg, dict) or not isinstance(msg.get("method"), str):
        return False, None
    id_ = msg.get("id")
    return is_request_id(id_), id_


@asynccontextmanager
async def ndjson_streams(
    stream: anyio.abc.ByteStream,
    *,
    max_bytes: int | Callable[[], int] = DEFAULT_MAX_BYTES,
    on_bad_message: Callable[[str], None] | None = None,
    fast_lane: Lane | None = None,
    message_timeout: float | None = None,
    idle_timeout: float = 0.0,
    admin: Admin | None = None,
    max_in_flight: int = MAX_IN_FLIGHT,
) -> AsyncIterator[tuple[Any, Any]]:
    """Yield `(read_stream, write_stream)` carrying MCP messages over `stream`.

    `fast_lane(request, send)`, when given, sees each `tools/call` request first (as decoded
    JSON) and may take it: it returns the whole JSON-RPC response, or an awaitable of it (run
    in its own task, which a `notifications/cancelled` naming the request, or the end of the
    connection, cancels; no response is sent then), or None to pass the request on to the
    SDK. `send(line)` writes a line to the peer (a progress notification), dropping it when
    the peer has gone. On a stream with `set_tap` (the socket's TransportStream), a chunk that
    is one whole `tools/call` line arriving while the reader waits goes to the lane from the
    stream's protocol (`tap`), with the same checks and the same results, one turn of the
    event loop sooner.

    `max_bytes` may be a callable, read as each chunk arrives (a reload's new limit applies to
    the connections already open). With `message_timeout`, the first message and every
    message once started must arrive within that many seconds, or the peer is told so and
    the read side ends (a stalled or slowloris peer holds no connection); with `idle_timeout`,
    a connection with no traffic either way for that long is told so and closed. With
    `admin`, a request whose method starts with `toolatlas/` (an operator command) is
    answered by it in its own task, never by the SDK;
    without it such a request goes to the SDK, which does not know it. The read side also
    ends when the peer closes; the write side closes the byte stream's sending half when the
    caller closes it. Contextvars set by the caller before entering
    travel with every inbound message to the handlers (the SDK's context streams).
    """
    limit = max_bytes if callable(max_bytes) else lambda: max_bytes  # a callable: read at each chunk
    splitter = BoundedLines(limit())
    read_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_reader = create_context_streams[SessionMessage](0)
    # Uncontended (one reply at a time, the usual case) it is taken without a trip through the
    # event loop: the default Lock yields on every acquire, a tenth of a cached search's time.
    send_lock = anyio.Lock(fast_acquire=True)

    last_traffic = time.monotonic()

    gone = False  # a write failed: nobody reads this connection any more
    started = False  # a first complete line has arrived

    async def send_raw(data: bytes) -> None:
        nonlocal last_traffic, gone
        async with send_lock:
            try:
                await stream.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                gone = True
                raise
        last_traffic = time.monotonic()

    async def send_if_open(data: bytes) -> None:
        """A reply to a peer that has gone is dropped."""
        try:
            await send_raw(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def bad(refusal: Refusal) -> None:
        if on_bad_message is not None:
            on_bad_message(refusal.message)
        log.debug("bad client message: %s", refusal.message)
        await send_if_open(refusal.line())

    # Lane requests in flight: plain asyncio tasks, not the task group's. anyio's start_soon
    # builds a task handle, a cancel scope and an event per task, about a tenth of the
    # daemon's CPU for a relayed call; nothing here needs them. A client's
    # notifications/cancelled cancels its request's task; the connection's end, every one.
    lane_tasks: set[asyncio.Task[None]] = set()
    lane_calls: dict[Any, asyncio.Task[None]] = {}  # by id: the first of a reused id in flight
    owed = _Owed()  # the SDK's requests in flight
    crowded = False  # the in-flight limit was reached on this connection (logged once)

    async def finish(id_: Any, pending: Awaitable[dict[str, Any]], what: str = "the search") -> None:
        try:
            line = _encode(await pending) + b"\n"
        except Exception:  # as the SDK answers a handler that raised
            log.exception("request %r failed", id_)
            line = Refusal(INTERNAL_ERROR, f"internal error: {what} failed; the daemon's log has the details", id_).line()
        if lane_calls.get(id_) is asyncio.current_task():
            del lane_calls[id_]  # sent whole from here on: a late cancel finds nothing to cut
        await send_if_open(line)

    def lane_done(task: asyncio.Task[None], id_: Any, pending: Awaitable[dict[str, Any]]) -> None:
        lane_tasks.discard(task)
        if lane_calls.get(id_) is task:
            del lane_calls[id_]
        if task.cancelled():
            if inspect.iscoroutine(pending):
                pending.close()  # cancelled before it started: never awaited, and no warning
        elif (exc := task.exception()) is not None:  # the send itself failed: a bug
            log.error("request %r: sending its response failed", id_, exc_info=exc)

    def start(id_: Any, pending: Awaitable[dict[str, Any]], what: str = "the search") -> None:
        task = asyncio.get_running_loop().create_task(finish(id_, pending, what))
        lane_tasks.add(task)
        lane_calls.setdefault(id_, task)
        task.add_done_callback(functools.partial(lane_done, id_=id_, pending=pending))

    def cancelled(line: bytes) -> None:
        """A client's notifications/cancelled for a lane request cancels its task."""
        try:
            msg = _decode(line)
        except Exception:  # noqa: BLE001 - the SDK path reports bad JSON
            return
        params = msg.get("params") if isinstance(msg, dict) else None
        if isinstance(params, dict) and msg.get("method") == "notifications/cancelled":
            task = lane_calls.pop(params.get("requestId"), None)
            if task is not None:
                task.cancel()
                log.debug("request %r cancelled by the client; no response", params.get("requestId"))

    def laned(line: bytes) -> tuple[Any, Any] | None:
        """The id and the lane's reply (a response, or an awaitable of one) of a `tools/call`
        line the lane takes; None: not taken (a failure to parse it leaves it to the SDK)."""
        assert fast_lane is not None
        try:
            msg = _decode(line)
            reply = fast_lane(msg, send_if_open) if isinstance(msg, dict) and msg.get("method") == "tools/call" else None
        except Exception:  # noqa: BLE001 - bad JSON and the like: the SDK path reports it
            log.debug("fast lane passed on a message", exc_info=True)
            return None
        return None if reply is None else (msg.get("id"), reply)

    async def fast(line: bytes) -> bool:
        """Whether `fast_lane` took this line."""
        got = laned(line)
        if got is None:
            return False
        id_, reply = got
        if isinstance(reply, dict):
            await send_if_open(_encode(reply) + b"\n")
        else:  # work to await (a search to run): its own task, so this reader goes on reading
            start(id_, reply)
        return True

    async def ready(reply: dict[str, Any]) -> dict[str, Any]:
        return reply

    send_now: Callable[[bytes], bool] | None = getattr(stream, "send_now", None)

    def tap(data: bytes) -> bool:
        """A chunk that is one whole `tools/call` line the lane takes, arriving while the
        reader waits with nothing of a line pending on a started connection: handed to the
        lane from the socket's protocol, as `take` and `handle_line` would hand it, without
        the reader's own turn of the event loop. Anything else is left to the reader."""
        nonlocal last_traffic
        if not started or splitter.pending or fast_lane is None or data.find(b"\n") != len(data) - 1 \
                or len(data) - 1 > limit() or b'"tools/call"' not in data or len(lane_tasks) + owed.count >= max_in_flight:
            return False
        got = laned(data)
        if got is None:
            return False  # the reader hands it to the SDK
        id_, reply = got
        last_traffic = time.monotonic()
        if isinstance(reply, dict):  # answered already (a cached search): written now when the
            # socket takes it without waiting, before the work the lane left for after its answer
            if not gone and not send_lock.locked() and send_now is not None and send_now(_encode(reply) + b"\n"):
                return True
            reply = ready(reply)
        start(id_, reply)
        return True

    async def over_limit(line: bytes) -> bool:
        """Whether `line` is a request refused for the requests already in flight."""
        nonlocal crowded
        is_request, id_ = _request_id(line)
        if not is_request:
            return False  # a notification (a cancel among them) or a reply: always taken
        if not crowded:
            crowded = True
            log.warning("a client has %d requests in flight on one connection; refusing more until "
                        "replies go out", max_in_flight)
        await send_if_open(Refusal(SERVER_ERROR, f"too many requests in flight on this connection: {max_in_flight} "
                                   "sent here are still waiting for their replies; read those replies (or "
                                   "cancel requests) before sending more", id_).line())
        return True

    async def handle_line(line: bytes | Oversized) -> None:
        if isinstance(line, Oversized):
            await bad(Refusal(INVALID_REQUEST, f"message exceeds the {splitter.limit}-byte limit and was discarded; "
                              "send a smaller one", line.request_id))
            return
        if line.startswith(_BOM):
            line = line[len(_BOM):]  # a UTF-8 BOM (some Windows tools write one first): not JSON
        if line in (b"", b"\r"):
            return
        if len(lane_tasks) + owed.count >= max_in_flight and await over_limit(line):
            return
        if fast_lane is not None and b'"tools/call"' in line and await fast(line):
            return
        if lane_calls and b'"notifications/cancelled"' in line:
            cancelled(line)  # and on to the SDK, which may have requests of its own to cancel
        message, refusal = screen(line)
        if refusal is not None:
            await bad(refusal)
            return
        assert message is not None  # screen gives one of the two
        if isinstance(message, types.JSONRPCRequest):
            if admin is not None and message.method.startswith(ADMIN_PREFIX):
                start(message.id, admin(message.id, message.method, message.params), "the command")
                return
            owed.add(message.id, listen=message.method == "subscriptions/listen")
        elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled" \
                and isinstance(message.params, dict) and message.params.get("requestId") is not None:
            owed.settle(message.params["requestId"])  # the SDK does not answer a cancelled request
        await read_writer.send(SessionMessage(message))

    async def replies_sent() -> None:
        """After the peer's EOF: a peer that only half-closed (the shim, its client done) gets
        the replies to every request it sent, each bounded by its own timeout (a listen stream
        aside: it ends with the connection). A peer that closed its socket (`peer_closed`) is
        gone: its requests are cancelled at once, as when it goes away mid-call."""
        closed = getattr(stream, "peer_closed", None)
        while not gone and (lane_tasks or owed.replies_due):
            if closed is None or closed():
                return
            await anyio.sleep(0.05)

    async def last_line() -> None:
        """A last message without its newline, from a peer that half-closed and still reads
        (one that closed its socket is gone: nothing is started for it)."""
        closed = getattr(stream, "peer_closed", None)
        if splitter.pending and not (closed is not None and closed()):
            for line in splitter.feed(b"", end=True):
                await handle_line(line)

    async def reader() -> None:
        nonlocal last_traffic

        async def take(data: bytes) -> None:
            nonlocal last_traffic, started
            last_traffic = time.monotonic()
            splitter.limit = limit()  # a reload may have changed it
            started = started or b"\n" in data
            for line in splitter.feed(data):
                await handle_line(line)

        # The tap runs in the socket protocol's callback: in this task's context (the
        # connection's contextvars), as `start` here would run a lane request.
        set_tap = getattr(stream, "set_tap", None) if fast_lane is not None else None
        if set_tap is not None:
            context = contextvars.copy_context()
            set_tap(lambda data: context.run(tap, data))
        try:
            async with read_writer:
                while True:
                    # One cancel scope for as long as no wait runs out; only its deadline moves
                    # (set for each receive, lifted while the lines are handled): entering and
                    # leaving a scope per message cost a fifth of a cached search's time here.
                    late: bytes | None = None  # data that came in as the wait ran out
                    bounded = False
                    with anyio.CancelScope() as waited:
                        while True:
                            bounded = message_timeout is not None and (splitter.pending or not started)
                            wait = message_timeout if bounded and message_timeout is not None else (
                                max(0.0, last_traffic + idle_timeout - time.monotonic()) if idle_timeout else math.inf)
                            waited.deadline = anyio.current_time() + wait
                            try:
                                data = await stream.receive(_CHUNK)
                            except anyio.EndOfStream:
                                waited.deadline = math.inf
                                await last_line()
                                await replies_sent()  # the peer half-closed: it still reads what it is owed
                                return
                            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                                return
                            waited.deadline = math.inf
                            if waited.cancel_called:  # handled outside, where no await is cancelled
                                late = data
                                break
                            await take(data)
                    if late is not None:
                        await take(late)
                        continue
                    if waited.cancelled_caught:
                        if bounded:
                            log.info("closing a client connection: no complete message within %g s", message_timeout)
                            await bad(Refusal(INVALID_REQUEST, f"no complete message arrived within "
                                              f"{message_timeout:g} s ([daemon] message_timeout); closing the connection"))
                            return
                        if time.monotonic() - last_traffic < idle_timeout:
                            continue  # a reply went out meanwhile: the connection is not idle
                        log.info("closing a client connection idle for %g s ([daemon] idle_timeout)", idle_timeout)
                        await bad(Refusal(INVALID_REQUEST, f"the connection was idle for {idle_timeout:g} s "
                                          "([daemon] idle_timeout) and is closed; connect again to go on"))
                        return
        except anyio.ClosedResourceError:
            pass
        finally:
            if set_tap is not None:
                set_tap(None)

    async def writer() -> None:
        try:
            async with write_reader:
                async for msg in write_reader:
                    payload = msg.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await send_raw(payload.encode() + b"\n")
                    if isinstance(msg.message, (types.JSONRPCResponse, types.JSONRPCError)):
                        owed.settle(msg.message.id)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            with anyio.move_on_after(1, shield=True):
                try:
                    await stream.send_eof()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, NotImplementedError):
                    pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            tg.cancel_scope.cancel()
            for task in lane_tasks:
                task.cancel()
            if lane_tasks:  # each unwinds at once (a relayed call's courtesy cancel is bounded)
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(set(lane_tasks))
