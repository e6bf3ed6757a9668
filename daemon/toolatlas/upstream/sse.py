"""The SSE (2024-11-05) client transport, made of the SDK's pieces, with our event size limit.

The SDK's ``sse_client`` reads its GET stream with a fixed 1 MiB event limit and ends the
whole session on a larger event. This is the same client (``sse_within_origin`` for the GET
stream, ``request_within_origin`` for each message POST, sent in the sender's context) on a
client the caller made, with the limit the caller gives: with ``bounded.limit_hook`` on that
client an event over ``max_result_bytes`` fails only the request it answers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from urllib.parse import urljoin, urlparse

import anyio
import httpx2
import mcp_types
from anyio.abc import TaskStatus
from mcp.client._transport import TransportStreams
from mcp.shared._context_streams import create_context_streams
from mcp.shared._httpx_utils import request_within_origin, sse_within_origin
from mcp.shared.message import SessionMessage

from toolatlas.upstream.answers import answered
from toolatlas.upstream.bounded import invalid_response
from toolatlas.upstream.client import STAND_IN, describe, shown_url

logger = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def sse_client(url: str, client: httpx2.AsyncClient, max_event_size: int,
                     name: str = "?") -> AsyncIterator[TransportStreams]:
    """``async with sse_client(url, client, limit, name) as (read, write)``; the read stream
    ends when the GET stream does (or breaks). `name` (the upstream's) is for log lines."""
    async with sse_within_origin(client, url, max_event_size=max_event_size) as source:
        source.response.raise_for_status()
        read_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
        write_stream, write_reader = create_context_streams[SessionMessage](0)

        async def reader(task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
            started = False
            try:
                async for sse in source:
                    if sse.event == "endpoint":
                        endpoint = urljoin(url, sse.data)
                        if urlparse(endpoint)[:2] != urlparse(url)[:2]:
                            raise ValueError(f"endpoint origin does not match connection origin: {endpoint}")
                        task_status.started(endpoint)
                        started = True
                    elif sse.event == "message" and sse.data:  # empty data: a keep-alive
                        try:
                            message = mcp_types.jsonrpc_message_adapter.validate_json(sse.data, by_name=False)
                        except ValueError as exc:
                            answer = invalid_response(sse.data)
                            await read_writer.send(exc if answer is None else SessionMessage(answer))
                            continue
                        await read_writer.send(SessionMessage(message))
                if not started:  # else anyio says only "Child exited without calling task_status.started()"
                    raise EOFError(f"the SSE stream at {shown_url(url)} ended before its endpoint event")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
            except Exception:
                if not started:
                    raise  # connecting fails with the reason
                logger.warning("SSE stream from %s failed", url, exc_info=True)
            finally:
                await read_writer.aclose()

        async def send(endpoint: str, msg: SessionMessage) -> None:
            """POST one message. A POST that fails fails that message's request at once (it
            waited out its timeout, and the writer ended, so every later request of the
            session failed as "Connection closed"); the session goes on."""
            try:
                response = await request_within_origin(
                    client, "POST", endpoint,
                    json=msg.message.model_dump(by_alias=True, mode="json", exclude_unset=True),
                )
            except httpx2.TransportError as exc:
                failure = f"the message POST to {shown_url(endpoint)} failed: {describe(exc)}"
            else:
                if response.is_success:
                    return
                failure = answered(response.status_code, response.reason_phrase, shown_url(endpoint),
                                   response.headers.get("content-type", ""), response.content)
            message = msg.message
            logger.warning("upstream %s: %s", name, failure)
            if isinstance(message, mcp_types.JSONRPCRequest):
                error = mcp_types.JSONRPCError(jsonrpc="2.0", id=message.id, error=mcp_types.ErrorData(
                    code=mcp_types.INTERNAL_ERROR, message=failure, data=dict(STAND_IN)))
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await read_writer.send(SessionMessage(error))

        async def writer(endpoint: str) -> None:
            try:
                async with write_reader, write_stream:
                    async for msg in write_reader:
                        sender = write_reader.last_context
                        async with anyio.create_task_group() as tg:
                            if sender is None:
                                tg.start_soon(send, endpoint, msg)
                            else:
                                sender.run(tg.start_soon, send, endpoint, msg)
            except Exception:
                logger.warning("SSE message POST to %s failed", url, exc_info=True)

        async with read_writer, read_stream, write_stream, write_reader, anyio.create_task_group() as tg:
            endpoint = await tg.start(reader)
            tg.start_soon(writer, endpoint)
            yield read_stream, write_stream
            tg.cancel_scope.cancel()


__all__ = ["sse_client"]
