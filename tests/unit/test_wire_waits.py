"""The socket reader's waits (`message_timeout`, `idle_timeout`) around messages: a message that
arrives just as its wait runs out is still delivered, and a wait that runs out with nothing
arriving still closes the connection with a refusal."""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.abc

from toolatlas.surface.wire import ndjson_streams

PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'


class SlowStream(anyio.abc.ByteStream):
    """Hands out `chunks`, each after `delay` seconds that no cancellation cuts short (so a
    chunk comes back to a reader whose wait ran out meanwhile); then waits forever."""

    def __init__(self, chunks: list[bytes], delay: float) -> None:
        self.chunks, self.delay, self.sent = list(chunks), delay, []  # type: ignore[var-annotated]

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self.chunks:
            await anyio.sleep_forever()
        with anyio.CancelScope(shield=True):
            await anyio.sleep(self.delay)
        return self.chunks.pop(0)

    async def send(self, item: bytes) -> None:
        self.sent.append(item)

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    @property
    def extra_attributes(self) -> Any:
        return {}


async def test_a_message_arriving_as_its_wait_runs_out_is_delivered() -> None:
    stream = SlowStream([PING], delay=0.3)
    async with ndjson_streams(stream, message_timeout=0.05) as (read, write), read, write:
        with anyio.fail_after(20):
            got = await read.receive()
    assert got.message.method == "ping"
    assert stream.sent == []  # no "no complete message" refusal


async def test_a_wait_that_runs_out_with_nothing_arriving_refuses_and_ends() -> None:
    stream = SlowStream([], delay=0)
    async with ndjson_streams(stream, message_timeout=0.05) as (read, write), read, write:
        with anyio.fail_after(20):
            async for _ in read:
                raise AssertionError("no message was sent")
    (line,) = stream.sent
    assert "message_timeout" in json.loads(line)["error"]["message"]
