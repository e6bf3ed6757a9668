"""Transports for the three upstream kinds, each an async context manager of (read, write).

The stdio transport is our own (modelled on the SDK's ``stdio_client``) because the pool
needs the child's pid, its exit code and its last stderr lines, and must own the shutdown
sequence: close stdin, wait, SIGTERM the process group, wait, SIGKILL. SSE and streamable
HTTP run on the SDK's pieces (``sse``, ``streamable_http_client``), every reply body read
through ``max_result_bytes`` (``bounded``) as stdio's lines are (``BoundedLines``). Every
transport reports the end of its read stream through ``on_eof`` so a dead peer is noticed
at once, not at the next health check.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp_types
from anyio.streams.text import TextReceiveStream
from mcp.client._transport import ReadStream, TransportStreams
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.shared.message import SessionMessage

from toolatlas.config import HttpUpstream, SseUpstream, StdioUpstream, Upstream
from toolatlas.jsonlines import BoundedLines, Oversized
from toolatlas.upstream.answers import answers_hook
from toolatlas.upstream.children import ChildProcess, spawn, stop_process, take
from toolatlas.upstream.bounded import (
    CancelWatch, Proxy, blocks_refusal, invalid_response, limit_hook, refusal, sse_event_limit,
    too_many_blocks,
)
from toolatlas.upstream.pages import parse_big_page
from toolatlas.upstream.posts import AbandonableTransport, Posts
from toolatlas.upstream.relay import Pending
from toolatlas.upstream.sse import sse_client
from toolatlas.upstream.toolrepair import repaired

logger = logging.getLogger(__name__)

_WRITER_FLUSH = 0.5
# Seconds from a stdio child's exit to its stdout's end, past which something else holds it.
EXIT_EOF_GRACE = 2.0
# stderr lines kept per child, for the DEGRADED reason when it dies.
STDERR_TAIL = 20
# Stdout lines that are not JSON-RPC logged one by one per child; the rest are counted and
# said in one line per GARBAGE_SUMMARY_INTERVAL seconds (and when stdout ends).
GARBAGE_LOGGED = 5
GARBAGE_SUMMARY_INTERVAL = 60.0
# Connections an HTTP upstream's client has beyond max_concurrency: event streams, pings, re-lists.
POOL_HEADROOM = 16
# tools/list requests remembered for the sliced parse of their answers (pages.py).
MAX_PENDING_LISTINGS = 64

Streams = TransportStreams
Incoming = SessionMessage | Exception
class EofWatch(Proxy):
    """A receive stream proxy that calls ``on_eof`` once when the stream ends or closes, and
    answers a result of more than `max_result_blocks` content blocks with a refusal before
    the SDK converts it (SSE and HTTP results are parsed by the SDK; stdio ones are counted
    earlier, by `too_many_blocks`), and hands a tools/list page's tools to `toolrepair`.

    Zero-copy: it delegates to the transport's stream, so no extra task or hop is added to
    the message path. Attributes it does not define (``last_context``, ``close``) pass through.
    """

    _inner: ReadStream[Incoming]

    def __init__(self, inner: ReadStream[Incoming], on_eof: Callable[[str], None], what: str, up: Upstream) -> None:
        self._inner = inner
        self._on_eof = on_eof
        self._what = what
        self._up = up

    async def receive(self) -> Incoming:
        try:
            item = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_eof(self._what)
            raise
        msg = item.message if isinstance(item, SessionMessage) else None
        if isinstance(msg, mcp_types.JSONRPCResponse):
            tools = msg.result.get("tools")
            if isinstance(tools, list):  # a tools/list page: one broken tool costs only that tool
                msg.result["tools"] = repaired(self._up.name, tools)
            content = msg.result.get("content")
            if isinstance(content, list) and len(content) > self._up.max_result_blocks:
                return SessionMessage(blocks_refusal(self._up, msg.id, len(content)))
        return item

    def __aiter__(self) -> EofWatch:
        return self

    async def __anext__(self) -> Incoming:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


class GarbageLog:
    """Warnings about a child's stdout lines that are not JSON-RPC, rate-limited: a server
    printing in a loop (~288 KiB/s of warnings before) must not flood the daemon's log."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen = 0
        self.suppressed = 0
        self.last = b""  # for the exit's reason when stderr said nothing (a usage or error text on stdout)
        self._summary_at = 0.0

    def line(self, line: bytes) -> None:
        self.seen += 1
        if line.strip():
            self.last = line[:400]
        if self.seen <= GARBAGE_LOGGED:
            more = f"; further ones are counted every {GARBAGE_SUMMARY_INTERVAL:g} s" if self.seen == GARBAGE_LOGGED else ""
            logger.warning("upstream %s: ignoring a stdout line that is not JSON-RPC: %.120r%s", self.name, line, more)
            self._summary_at = time.monotonic() + GARBAGE_SUMMARY_INTERVAL
            return
        self.suppressed += 1
        if time.monotonic() >= self._summary_at:
            self.flush()

    def flush(self) -> None:
        """Say how many lines went unlogged since the last summary (if any did)."""
        if self.suppressed:
            logger.warning("upstream %s: ignored %d more stdout lines that are not JSON-RPC (%d in all)",
                           self.name, self.suppressed, self.seen)
            self.suppressed = 0
        self._summary_at = time.monotonic() + GARBAGE_SUMMARY_INTERVAL


class StdioProcess:
    """A spawned stdio MCP server: ``async with StdioProcess(up) as (read, write)``.

    ``pid``, ``returncode`` and ``stderr_tail`` are readable while and after it runs.
    Exiting the context always stops the child (and its process group), shielded and
    bounded by children.STDIN_CLOSE_GRACE + SIGTERM_GRACE + a short reap wait.
    """

    def __init__(self, upstream: StdioUpstream, on_eof: Callable[[str], None] | None = None) -> None:
        self.upstream = upstream
        self.pid: int | None = None
        self.process: anyio.abc.Process | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._on_eof = on_eof or (lambda _what: None)
        self._stack: contextlib.AsyncExitStack | None = None
        self._garbage = GarbageLog(upstream.name)
        self._stopped_with: int | None = None  # the signal stop_process had to send, if any
        # ids of the tools/list requests sent and not answered yet: a large answer to one is
        # parsed in slices (pages.py), not in one GIL-holding call.
        self._listing_ids: set[int | str] = set()
        # tools/call requests the raw relay wrote (relay.py): their replies skip the SDK's parse.
        self.relay = Pending(upstream)

    async def send_line(self, data: bytes) -> None:
        """Write one whole JSON-RPC line to the child's stdin (the raw relay; the SDK's
        writer task writes whole lines too, so they never interleave)."""
        stdin = self.process.stdin if self.process is not None else None
        if stdin is None:
            raise anyio.ClosedResourceError
        try:
            await stdin.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self._on_eof("stdio")  # the child stopped reading: the session is gone, as the SDK's writer finds
            raise

    def _parse_line(self, line: bytes | Oversized) -> SessionMessage | Exception | None:
        """One stdout line as a message; an oversized one becomes an error for its request."""
        up = self.upstream
        if isinstance(line, Oversized):
            logger.warning("upstream %s: refused a %d-byte message (limit %d bytes)",
                           up.name, line.size, up.max_result_bytes)
            return None if line.request_id is None else SessionMessage(refusal(up, line.request_id))
        refused = too_many_blocks(up, line)
        if refused is not None:
            return SessionMessage(refused)
        if not line.strip():
            return None
        try:
            return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:
            if (answer := invalid_response(line)) is not None:
                logger.warning("upstream %s: an invalid response to request %r: %.200r", up.name, answer.id, line)
                return SessionMessage(answer)
            self._garbage.line(line)
            return exc

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    async def exit_reason(self, wait: float) -> str | None:
        """`describe_exit()` once the child has exited, waiting up to `wait` s for that (its
        stdout ends as it exits, a moment before its exit status can be read); else None."""
        with anyio.move_on_after(wait):
            while self.returncode is None:
                await anyio.sleep(0.01)
        return None if self.returncode is None else self.describe_exit()

    def describe_exit(self) -> str:
        code = self.returncode
        if code is None:
            return "stdio child closed its stdout"
        if code < 0 and -code == self._stopped_with:  # toolatlas's signal: the child had not exited
            return f"stdio child closed its stdout but kept running; toolatlas stopped it (signal {-code})"
        how = f"signal {-code}" if code < 0 else f"code {code}"
        last = self.last_words()
        return f"stdio child exited with {how}" + (f" ({last})" if last else "")

    def last_words(self) -> str:
        """The child's last stderr line as "stderr: ...", else its last stdout line that was not
        JSON-RPC as "stdout: ..." (many a server prints its usage or its error there), or ""."""
        last = next((f"stderr: {line}" for line in reversed(self.stderr_tail) if line.strip()), "")
        if not last and self._garbage.last:
            last = "stdout: " + self._garbage.last.decode("utf-8", "replace").strip()
        return last[:208]

    async def __aenter__(self) -> Streams:
        self._cm = self._run()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._cm.__aexit__(*exc)

    @contextlib.asynccontextmanager
    async def _run(self) -> AsyncIterator[Streams]:
        up = self.upstream
        # A child the CLI started while the daemon imported (children.prespawn), else a new one.
        early = take(up)
        process = await ChildProcess.attach(early or spawn(up))
        if early is not None:
            logger.info("upstream %s: took the child started early (pid %d)", up.name, process.pid)
        # No await between attach and the try below, or a cancellation would leak the child.
        self.process = process
        self.pid = process.pid
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
        writer_done = anyio.Event()
        closing = anyio.Event()  # the session is shutting the child down: its stdout's end is ours
        stdout_ended = anyio.Event()

        async def stdout_reader() -> None:
            assert process.stdout is not None
            lines = BoundedLines(up.max_result_bytes)
            relay = self.relay

            def tap(chunk: bytes) -> bool:
                """A chunk that is one whole line of a relayed call's (its reply or progress),
                nothing of an earlier line pending: to its waiting call, as the loop below
                hands it, without this task's turn of the event loop first."""
                return bool(relay) and not lines.pending and chunk.find(b"\n") == len(chunk) - 1 \
                    and len(chunk) - 1 <= lines.limit and relay.take(chunk[:-1])

            process.tap_stdout(tap)
            try:
                async with read_writer:
                    async for chunk in process.stdout:
                        for line in lines.feed(chunk):
                            if self.relay and self.relay.take(line):
                                continue
                            big = None
                            if isinstance(line, bytes) and self._listing_ids:
                                big = await parse_big_page(line, self._listing_ids, up.name)
                            item = SessionMessage(big) if big is not None else self._parse_line(line)
                            if self._listing_ids and isinstance(item, SessionMessage) and isinstance(
                                    item.message, (mcp_types.JSONRPCResponse, mcp_types.JSONRPCError)):
                                self._listing_ids.discard(item.message.id)
                            if item is None:
                                continue
                            try:
                                await read_writer.send(item)
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return
                if not closing.is_set():
                    # stdout ended: said before the relayed calls fail with "Connection closed"
                    # (below), so they read as a lost session, not as the upstream's own -32000.
                    self._on_eof("stdio")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass
            finally:
                process.tap_stdout(None)
                stdout_ended.set()
                self.relay.close()
                self._garbage.flush()

        async def exit_watch() -> None:
            """The child's exit ends the session even when its stdout does not end: a process
            it started (and left running) holds the pipe. Its group is stopped on the way out."""
            await process.exited()
            with anyio.move_on_after(EXIT_EOF_GRACE):
                await stdout_ended.wait()
            if not stdout_ended.is_set() and not closing.is_set():
                logger.warning("upstream %s: %s, but its stdout is still open (a process it started holds "
                               "it); ending the session", up.name, self.describe_exit().removeprefix("stdio "))
                self._on_eof("stdio")

        async def stdin_writer() -> None:
            assert process.stdin is not None
            try:
                async with write_reader:
                    async for msg in write_reader:
                        if isinstance(msg.message, mcp_types.JSONRPCRequest) and msg.message.method == "tools/list":
                            if len(self._listing_ids) >= MAX_PENDING_LISTINGS:
                                self._listing_ids.clear()  # never answered: those take the ordinary path
                            self._listing_ids.add(msg.message.id)
                        data = msg.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                        await process.stdin.send(data.encode())
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                # The child stopped reading: end the session instead of hanging a request.
                await read_writer.aclose()
            finally:
                writer_done.set()

        async def stderr_reader() -> None:
            assert process.stderr is not None
            buf = ""
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for chunk in TextReceiveStream(process.stderr, encoding="utf-8", errors="replace"):
                    lines = (buf + chunk).split("\n")
                    buf = lines.pop()[-4096:]
                    for line in lines:
                        self.stderr_tail.append(line)
                        logger.debug("upstream %s stderr: %s", up.name, line)

        async def shutdown() -> None:
            closing.set()
            read_stream.close()
            write_stream.close()
            with anyio.move_on_after(_WRITER_FLUSH):
                await writer_done.wait()
            self._stopped_with = await stop_process(process, up.name)
            for s in (read_stream, write_stream, read_writer, write_reader):
                await s.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stdout_reader)
            tg.start_soon(stdin_writer)
            tg.start_soon(stderr_reader)
            tg.start_soon(exit_watch)
            try:
                yield EofWatch(read_stream, self._on_eof, "stdio", up), write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    await shutdown()
                tg.cancel_scope.cancel()


def _http_client(up: SseUpstream | HttpUpstream, streams: Posts | None = None) -> httpx2.AsyncClient:
    """The upstream's HTTP client; every body it reads is bounded by max_result_bytes (and
    with `streams` an abandoned request's POST or event stream is ended: posts.py)."""
    # Connect bounded by the upstream's connect timeout; reads stay long (SSE streams idle).
    timeout = httpx2.Timeout(up.timeouts.connect, read=max(300.0, up.timeouts.call + 30.0))
    # Each call in flight holds a connection (and an event stream one more): httpx2's 100 made
    # the 101st request of a max_concurrency above that wait until the session failed (PoolTimeout).
    limits = httpx2.Limits(max_connections=max(100, up.max_concurrency + POOL_HEADROOM), max_keepalive_connections=20)
    # The SDK's create_mcp_http_client, with those limits, on a transport that can end an abandoned POST.
    transport: httpx2.AsyncBaseTransport = httpx2.AsyncHTTPTransport(limits=limits)
    if streams is not None:
        transport = AbandonableTransport(transport, streams, up.name)
    client = httpx2.AsyncClient(headers=dict(up.headers) or None, timeout=timeout, transport=transport)
    client.event_hooks["response"].append(limit_hook(up, streams))
    return client


@contextlib.asynccontextmanager
async def sse_transport(up: SseUpstream, on_eof: Callable[[str], None]) -> AsyncIterator[Streams]:
    async with _http_client(up) as client, sse_client(up.url, client, sse_event_limit(up), up.name) as (read, write):
        yield EofWatch(read, on_eof, "sse", up), write


OnResponse = Callable[[int, str], None]  # (HTTP status, request URL)


def _response_hook(
    on_expired: Callable[[], None] | None, on_response: OnResponse | None
) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A response hook that reports every status (``on_response``) and a 404 to a message
    POSTed with a (2025-era) session id (``on_expired``: by the spec the server no longer knows
    the session). Runs before the SDK hands the request its error, so the session knows why
    the request failed. A GET's 404 is not one: a server that routes only POST answers the
    optional event stream so, and took every later error of a call for the session's end."""

    async def hook(response: httpx2.Response) -> None:
        if on_response is not None:
            on_response(response.status_code, str(response.request.url))
        request = response.request
        if on_expired is not None and response.status_code == 404 and request.method == "POST" and (
                MCP_SESSION_ID in request.headers):
            on_expired()

    return hook


@contextlib.asynccontextmanager
async def http_transport(
    up: HttpUpstream, on_eof: Callable[[str], None], on_expired: Callable[[], None] | None = None,
    on_response: OnResponse | None = None,
) -> AsyncIterator[Streams]:
    streams = Posts()
    async with _http_client(up, streams) as client:
        client.event_hooks["response"].append(answers_hook(up))  # after the limit: reads a bounded body
        if on_expired is not None or on_response is not None:
            client.event_hooks["response"].append(_response_hook(on_expired, on_response))
        async with streamable_http_client(
            up.url, http_client=client, max_sse_event_size=sse_event_limit(up)
        ) as (read, write):
            yield EofWatch(read, on_eof, "http", up), CancelWatch(write, streams)


def open_transport(
    up: Upstream, on_eof: Callable[[str], None], on_expired: Callable[[], None] | None = None,
    on_response: OnResponse | None = None,
) -> contextlib.AbstractAsyncContextManager[Streams] | StdioProcess:
    """The transport context manager for ``up`` (not yet entered).

    ``on_eof(kind)`` hears the end of the read stream; streamable HTTP only: ``on_expired()``
    hears a 404 on our session id, ``on_response(status, url)`` every response's status."""
    if isinstance(up, StdioUpstream):
        return StdioProcess(up, on_eof)
    if isinstance(up, SseUpstream):
        return sse_transport(up, on_eof)
    return http_transport(up, on_eof, on_expired, on_response)


__all__ = ["EofWatch", "StdioProcess", "open_transport", "stop_process"]
