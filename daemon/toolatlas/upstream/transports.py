"""Transports for the three upstream kinds, each an async context manager of (read, write).

The stdio transport is our own (modelled on the SDK's ``stdio_client``) because the pool
needs the child's pid, its exit code and its last stderr lines, and must own the shutdown
sequence: close stdin, wait, SIGTERM the process group, wait, SIGKILL. SSE and streamable
HTTP wrap the SDK clients. Every transport reports the end of its read stream through
``on_eof`` so a dead peer is noticed at once, not at the next health check.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp_types
import msgspec
from anyio.streams.text import TextReceiveStream
from mcp.client._transport import ReadStream, TransportStreams
from mcp.client.sse import sse_client
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage

from toolatlas.config import HttpUpstream, SseUpstream, StdioUpstream, Upstream
from toolatlas.jsonlines import BoundedLines, Oversized

logger = logging.getLogger(__name__)

# Seconds a stdio child gets to exit by itself after its stdin closes, then after SIGTERM.
STDIN_CLOSE_GRACE = 2.0
SIGTERM_GRACE = 2.0
_WRITER_FLUSH = 0.5
_POLL = 0.01
# stderr lines kept per child, for the DEGRADED reason when it dies.
STDERR_TAIL = 20

Streams = TransportStreams
Incoming = SessionMessage | Exception
# The fewest bytes a content block takes in JSON (`{"type":"text"}` and a comma).
_MIN_BLOCK_BYTES = 16


def refusal(request_id: str | int, message: str) -> SessionMessage:
    """The JSON-RPC error that answers request `request_id` in place of a refused result."""
    return SessionMessage(mcp_types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=mcp_types.ErrorData(code=-32603, message=message)))


def blocks_refusal(up: Upstream, request_id: str | int, blocks: int) -> SessionMessage:
    logger.warning("upstream %s: refused a result of %d content blocks (limit %d)", up.name, blocks, up.max_result_blocks)
    return refusal(request_id, f"the result from upstream {up.name!r} has {blocks} content blocks, more than "
                               f"max_result_blocks ({up.max_result_blocks}), and was refused")


class _Block(msgspec.Struct):
    pass  # decoded without its fields: only the count matters


class _Result(msgspec.Struct):
    content: list[_Block] | None = None


class _Reply(msgspec.Struct):
    id: int | str | None = None
    result: _Result | None = None


_count_blocks = msgspec.json.Decoder(_Reply).decode


def too_many_blocks(up: Upstream, line: bytes) -> SessionMessage | None:
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


class EofWatch:
    """A receive stream proxy that calls ``on_eof`` once when the stream ends or closes, and
    answers a result of more than `max_result_blocks` content blocks with a refusal before
    the SDK converts it (SSE and HTTP results are parsed by the SDK; stdio ones are counted
    earlier, by `too_many_blocks`).

    Zero-copy: it delegates to the transport's stream, so no extra task or hop is added to
    the message path. Attributes it does not define (``last_context``, ``close``) pass through.
    """

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
            content = msg.result.get("content")
            if isinstance(content, list) and len(content) > self._up.max_result_blocks:
                return blocks_refusal(self._up, msg.id, len(content))
        return item

    def __aiter__(self) -> EofWatch:
        return self

    async def __anext__(self) -> Incoming:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> EofWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class StdioProcess:
    """A spawned stdio MCP server: ``async with StdioProcess(up) as (read, write)``.

    ``pid``, ``returncode`` and ``stderr_tail`` are readable while and after it runs.
    Exiting the context always stops the child (and its process group), shielded and
    bounded by STDIN_CLOSE_GRACE + SIGTERM_GRACE + a short reap wait.
    """

    def __init__(self, upstream: StdioUpstream, on_eof: Callable[[str], None] | None = None) -> None:
        self.upstream = upstream
        self.pid: int | None = None
        self.process: anyio.abc.Process | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._on_eof = on_eof or (lambda _what: None)
        self._stack: contextlib.AsyncExitStack | None = None

    def _parse_line(self, line: bytes | Oversized) -> SessionMessage | Exception | None:
        """One stdout line as a message; an oversized one becomes an error for its request."""
        up = self.upstream
        if isinstance(line, Oversized):
            logger.warning("upstream %s: refused a %d-byte message (limit %d bytes)",
                           up.name, line.size, up.max_result_bytes)
            if line.request_id is None:
                return None
            return refusal(line.request_id, f"the result from upstream {up.name!r} is larger than max_result_bytes "
                                            f"({up.max_result_bytes} bytes) and was refused")
        refused = too_many_blocks(up, line)
        if refused is not None:
            return refused
        if not line.strip():
            return None
        try:
            return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:
            logger.warning("upstream %s: ignoring a stdout line that is not JSON-RPC: %.120r", up.name, line)
            return exc

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def describe_exit(self) -> str:
        code = self.returncode
        if code is None:
            return "stdio child closed its stdout"
        how = f"signal {-code}" if code < 0 else f"code {code}"
        last = next((line for line in reversed(self.stderr_tail) if line.strip()), "")
        return f"stdio child exited with {how}" + (f" (stderr: {last[:200]})" if last else "")

    async def __aenter__(self) -> Streams:
        self._cm = self._run()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._cm.__aexit__(*exc)

    @contextlib.asynccontextmanager
    async def _run(self) -> AsyncIterator[Streams]:
        up = self.upstream
        env = get_default_environment() | dict(up.env)
        process = await anyio.open_process(
            [up.command, *up.args],
            env=env,
            cwd=up.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: SIGTERM/SIGKILL reach grandchildren
        )
        # No await between spawn and the try below, or a cancellation would leak the child.
        self.process = process
        self.pid = process.pid
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
        writer_done = anyio.Event()

        async def stdout_reader() -> None:
            assert process.stdout is not None
            lines = BoundedLines(up.max_result_bytes)
            try:
                async with read_writer:
                    async for chunk in process.stdout:
                        for line in lines.feed(chunk):
                            item = self._parse_line(line)
                            if item is None:
                                continue
                            try:
                                await read_writer.send(item)
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass

        async def stdin_writer() -> None:
            assert process.stdin is not None
            try:
                async with write_reader:
                    async for msg in write_reader:
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
            read_stream.close()
            write_stream.close()
            with anyio.move_on_after(_WRITER_FLUSH):
                await writer_done.wait()
            await stop_process(process, up.name)
            for s in (read_stream, write_stream, read_writer, write_reader):
                await s.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stdout_reader)
            tg.start_soon(stdin_writer)
            tg.start_soon(stderr_reader)
            try:
                yield EofWatch(read_stream, self._on_eof, "stdio", up), write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    await shutdown()
                tg.cancel_scope.cancel()


async def _wait_exit(process: anyio.abc.Process, timeout: float) -> bool:
    # Poll returncode, not process.wait(): wait() also waits for pipe EOF, which a
    # grandchild holding the pipes can delay forever.
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(_POLL)
    return process.returncode is not None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_process(process: anyio.abc.Process, name: str) -> None:
    """Close stdin, wait, SIGTERM the group, wait, SIGKILL the group. Shielded and bounded."""
    with anyio.CancelScope(shield=True):
        pgid = process.pid  # start_new_session: the child leads its own group
        if process.stdin is not None:
            with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await process.stdin.aclose()
        if not await _wait_exit(process, STDIN_CLOSE_GRACE):
            logger.info("upstream %s: child %d ignored stdin close; sending SIGTERM", name, pgid)
            _signal_group(pgid, signal.SIGTERM)
            if not await _wait_exit(process, SIGTERM_GRACE):
                logger.warning("upstream %s: child %d ignored SIGTERM; sending SIGKILL", name, pgid)
                _signal_group(pgid, signal.SIGKILL)
                if not await _wait_exit(process, 2.0):
                    logger.error("upstream %s: child %d survived SIGKILL; abandoning it", name, pgid)
        # Leftover grandchildren in the child's group (npx -> node) must not outlive it.
        _signal_group(pgid, signal.SIGTERM)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await stream.aclose()
        transport = getattr(getattr(process, "_process", None), "_transport", None)
        close = getattr(transport, "close", None)
        if callable(close):
            with contextlib.suppress(PermissionError):
                close()


def _http_client(up: SseUpstream | HttpUpstream) -> httpx2.AsyncClient:
    # Connect bounded by the upstream's connect timeout; reads stay long (SSE streams idle).
    timeout = httpx2.Timeout(up.timeouts.connect, read=max(300.0, up.timeouts.call + 30.0))
    return create_mcp_http_client(headers=dict(up.headers) or None, timeout=timeout)


@contextlib.asynccontextmanager
async def sse_transport(up: SseUpstream, on_eof: Callable[[str], None]) -> AsyncIterator[Streams]:
    async with sse_client(
        up.url,
        headers=dict(up.headers) or None,
        timeout=up.timeouts.connect,
        sse_read_timeout=max(300.0, up.timeouts.call + 30.0),
    ) as (read, write):
        yield EofWatch(read, on_eof, "sse", up), write


def _expiry_hook(on_expired: Callable[[], None]) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A response hook that reports a 404 to a request carrying a (2025-era) session id:
    by the spec the server no longer knows the session. Runs before the SDK hands the
    request its error, so the session knows why the request failed."""

    async def hook(response: httpx2.Response) -> None:
        if response.status_code == 404 and MCP_SESSION_ID in response.request.headers:
            on_expired()

    return hook


@contextlib.asynccontextmanager
async def http_transport(
    up: HttpUpstream, on_eof: Callable[[str], None], on_expired: Callable[[], None] | None = None
) -> AsyncIterator[Streams]:
    async with _http_client(up) as client:
        if on_expired is not None:
            client.event_hooks["response"].append(_expiry_hook(on_expired))
        async with streamable_http_client(up.url, http_client=client) as (read, write):
            yield EofWatch(read, on_eof, "http", up), write


def open_transport(
    up: Upstream, on_eof: Callable[[str], None], on_expired: Callable[[], None] | None = None
) -> contextlib.AbstractAsyncContextManager[Streams] | StdioProcess:
    """The transport context manager for ``up`` (not yet entered).

    ``on_eof(kind)`` hears the end of the read stream; ``on_expired()`` (streamable HTTP
    only) hears a 404 on our session id."""
    if isinstance(up, StdioUpstream):
        return StdioProcess(up, on_eof)
    if isinstance(up, SseUpstream):
        return sse_transport(up, on_eof)
    return http_transport(up, on_eof, on_expired)


__all__ = ["EofWatch", "StdioProcess", "open_transport", "stop_process"]
