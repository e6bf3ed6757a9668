"""A connected Unix socket as an anyio `ByteStream` over an asyncio transport.

anyio's own Unix socket stream reads a raw socket: each `receive` first yields to the event
loop, tries recv(2), and on EAGAIN registers the socket with the loop, waits on a future,
then unregisters it; each `send` yields first too: for a request and its reply, two extra
loop iterations, a failed recv(2) and a poll handle made and dropped (uvloop). A transport
keeps reading and hands data over as it comes: a request/response round over a socket pair
cost 81-97 us of CPU with anyio's stream and 26-31 us with this one (bench/socket_stream.py,
bench/README.md stop 37). Here the loop's transport owns the socket and a small protocol
buffers what it reads:

- reading pauses while more than READ_HIGH bytes wait to be received (the peer then meets
  the kernel's buffer, as before) and resumes below READ_LOW;
- `send` returns once the transport took the bytes, and waits while its write buffer is
  above the transport's high-water mark (`pause_writing`), so a peer that does not read
  holds at most that much in the daemon;
- the peer's EOF is `EndOfStream` after the data before it, and the stream stays open for
  writing (the shim half-closes and waits for the replies still owed; `peer_closed` tells that
  from a peer that closed its socket); `send_eof` half-closes ours; a reset is
  `BrokenResourceError`, a stream closed here `ClosedResourceError`;
- `aclose` lets the transport flush what it holds, and aborts it after CLOSE_GRACE_S if the
  peer does not take it.
"""

from __future__ import annotations

import asyncio
import select
import socket
from collections import deque
from collections.abc import Callable
from typing import cast

import anyio
import anyio.abc
import anyio.lowlevel

READ_HIGH = 256 * 1024
READ_LOW = 64 * 1024
CLOSE_GRACE_S = 5.0


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.size = 0  # bytes in `chunks`
        self.eof = False
        self.lost = False
        self.error: BaseException | None = None
        self.paused = False  # reading paused (too much waiting in `chunks`)
        self.writable = True  # False between pause_writing and resume_writing
        self.read_waiter: asyncio.Future[None] | None = None  # a receive waiting for data
        self.write_waiter: asyncio.Future[None] | None = None  # a send waiting for the buffer to drain
        self.tap: Callable[[bytes], bool] | None = None

    def wake_reader(self) -> None:
        if self.read_waiter is not None and not self.read_waiter.done():
            self.read_waiter.set_result(None)

    def wake_writer(self) -> None:
        if self.write_waiter is not None and not self.write_waiter.done():
            self.write_waiter.set_result(None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        waiter = self.read_waiter
        if self.tap is not None and not self.chunks and waiter is not None and not waiter.done() and self.tap(data):
            return  # taken while the reader waits with nothing buffered: see TransportStream.set_tap
        self.chunks.append(data)
        self.size += len(data)
        if self.size > READ_HIGH and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self.wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        self.wake_reader()
        return True  # keep the transport open: replies may still be owed

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost, self.error = True, exc
        self.writable = True
        self.wake_reader()
        self.wake_writer()

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self.wake_writer()


class TransportStream(anyio.abc.ByteStream):
    """See the module docstring. Make one with `adopt`; one reader and one writer at a time."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._closing = False
        self._eof_sent = False

    @classmethod
    async def adopt(cls, stream: anyio.abc.SocketStream) -> TransportStream:
        """The connected socket of anyio's `stream`, moved to a transport (`stream` is done)."""
        raw: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        sock = socket.socket(family=raw.family, type=raw.type, fileno=raw.detach())
        await stream.aclose()  # its socket object no longer holds the descriptor
        proto = _Protocol()
        try:
            transport, _ = await asyncio.get_running_loop().connect_accepted_socket(lambda: proto, sock)
        except BaseException:
            sock.close()
            raise
        return cls(transport, proto)

    def set_tap(self, tap: Callable[[bytes], bool] | None) -> None:
        """Offer each chunk that arrives while a receive waits with nothing buffered to `tap`
        first; one it returns True for is consumed there and never received. Anything that
        arrives while a chunk waits to be received is buffered behind it, so what is
        received keeps the peer's order. None stops it."""
        self._protocol.tap = tap

    def peer_closed(self) -> bool:
        """Whether the peer closed its socket (POLLHUP), not only its sending half as the shim
        does when its client is done and it waits for the replies still owed."""
        sock = self._transport.get_extra_info("socket")
        if sock is None or self._protocol.lost or self._transport.is_closing():
            return True
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return any(events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, events in poller.poll(0))

    async def _wait(self, reading: bool) -> None:
        """Until the protocol wakes the reader (`reading`) or the writer."""
        proto = self._protocol
        fut = asyncio.get_running_loop().create_future()
        if reading:
            proto.read_waiter = fut
        else:
            proto.write_waiter = fut
        try:
            await fut
        finally:
            if reading:
                proto.read_waiter = None
            else:
                proto.write_waiter = None

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if max_bytes < 1:
            raise ValueError("max_bytes must be a positive integer")
        proto = self._protocol
        while not proto.chunks:
            if self._closing:
                raise anyio.ClosedResourceError
            if proto.eof:
                raise anyio.EndOfStream
            if proto.lost:
                if proto.error is not None:
                    raise anyio.BrokenResourceError from proto.error
                raise anyio.EndOfStream
            await self._wait(reading=True)
        data = proto.chunks.popleft()
        if len(data) > max_bytes:
            proto.chunks.appendleft(data[max_bytes:])
            data = data[:max_bytes]
        proto.size -= len(data)
        if proto.paused and proto.size < READ_LOW and not proto.lost:
            proto.paused = False
            self._transport.resume_reading()
        return data

    def _sending_ended(self) -> bool:
        """Whether nothing more can be written: the connection lost, EOF sent, or the
        transport closing."""
        return self._protocol.lost or self._eof_sent or self._transport.is_closing()

    async def send(self, item: bytes) -> None:
        proto = self._protocol
        if self._closing:
            raise anyio.ClosedResourceError
        if self._sending_ended():  # as send(2) after shutdown: EPIPE
            raise anyio.BrokenResourceError from proto.error
        self._transport.write(item)
        while not proto.writable and not proto.lost and not self._closing:
            await self._wait(reading=False)

    def send_now(self, item: bytes) -> bool:
        """Write `item` without waiting, when the stream is open and its buffer below the
        high-water mark (`send` would not wait before writing); False: nothing was written."""
        if self._closing or self._sending_ended() or not self._protocol.writable:
            return False
        self._transport.write(item)
        return True

    async def send_eof(self) -> None:
        if self._closing:
            raise anyio.ClosedResourceError
        if not self._sending_ended() and self._transport.can_write_eof():
            self._eof_sent = True
            self._transport.write_eof()

    async def aclose(self) -> None:
        if not self._closing:
            self._closing = True
            transport = self._transport
            pending = transport.get_write_buffer_size()
            transport.close()
            if pending:  # flushed by the loop; a peer that never reads must not hold it forever
                asyncio.get_running_loop().call_later(CLOSE_GRACE_S, transport.abort)
            self._protocol.wake_reader()
            self._protocol.wake_writer()
        await anyio.lowlevel.checkpoint()


__all__ = ["CLOSE_GRACE_S", "READ_HIGH", "READ_LOW", "TransportStream"]
