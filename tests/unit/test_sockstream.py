"""surface.sockstream.TransportStream over real Unix socket pairs, against anyio's contract
for a ByteStream: data in order, EOF after the data, half-close, resets, close, and the
read-side flow control that keeps a flooding peer in the kernel's buffer."""

from __future__ import annotations

import socket

import anyio
import anyio.abc
import pytest

from toolatlas.surface import sockstream
from toolatlas.surface.sockstream import TransportStream

async def pair() -> tuple[TransportStream, socket.socket]:
    """Our stream on one end of a socket pair; the other end as a plain blocking socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stream = await TransportStream.adopt(await anyio.abc.UNIXSocketStream.from_socket(ours))
    return stream, theirs


async def read_all(stream: TransportStream) -> bytes:
    got = b""
    with anyio.fail_after(10):
        while True:
            try:
                got += await stream.receive()
            except anyio.EndOfStream:
                return got


async def test_data_in_order_then_eof_and_the_stream_still_writes_after_the_peers_half_close() -> None:
    stream, peer = await pair()
    async with stream:
        peer.sendall(b"one\n" * 1000)
        peer.sendall(b"two\n")
        peer.shutdown(socket.SHUT_WR)
        assert await read_all(stream) == b"one\n" * 1000 + b"two\n"
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()
        await stream.send(b"reply owed\n")  # the shim half-closes and waits for its replies
        await stream.send_eof()
        with pytest.raises(anyio.BrokenResourceError):  # as send(2) after shutdown(2)
            await stream.send(b"too late\n")
        peer.settimeout(10)
        got = b""
        while chunk := peer.recv(65536):
            got += chunk
        assert got == b"reply owed\n"
    peer.close()


async def test_receive_honours_max_bytes_without_losing_the_rest() -> None:
    stream, peer = await pair()
    async with stream:
        peer.sendall(b"abcdefghij")
        with anyio.fail_after(10):
            first = await stream.receive(3)
            rest = b""
            while len(first) + len(rest) < 10:
                rest += await stream.receive(4)
        assert len(first) == 3 and first + rest == b"abcdefghij"
        with pytest.raises(ValueError):
            await stream.receive(0)
    peer.close()


async def test_a_peer_that_floods_is_held_in_the_kernel_not_in_the_daemon() -> None:
    stream, peer = await pair()
    peer.setblocking(False)
    sent = 0
    block = b"x" * 65536
    async with stream:
        # Write until the kernel refuses: with reading paused past READ_HIGH, it must refuse
        # well before the daemon side has buffered everything (bounded loop).
        for _ in range(4096):
            try:
                sent += peer.send(block)
            except BlockingIOError:
                await anyio.sleep(0.05)  # let the loop read what it will
                try:
                    sent += peer.send(block)
                except BlockingIOError:
                    break
        else:
            pytest.fail(f"the peer wrote {sent} bytes and was never held back")
        buffered = stream._protocol.size
        assert buffered <= sockstream.READ_HIGH + 65536 * 4, buffered
        assert stream._protocol.paused
        # Draining what was buffered resumes reading; every byte arrives.
        total = 0
        with anyio.fail_after(30):
            while total < sent:
                total += len(await stream.receive())
        assert total == sent
        assert not stream._protocol.paused
    peer.close()


async def test_a_reset_is_a_broken_resource_and_a_local_close_a_closed_one() -> None:
    stream, peer = await pair()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    peer.close()
    with anyio.fail_after(10):
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await stream.receive()
        # Writing to a peer that is gone fails (at once or on the next send), never hangs.
        with pytest.raises(anyio.BrokenResourceError):
            for _ in range(100):
                await stream.send(b"x" * 65536)
                await anyio.sleep(0.01)
    await stream.aclose()

    stream, peer = await pair()
    async with anyio.create_task_group() as tg:
        caught: list[type[BaseException]] = []

        async def reader() -> None:
            try:
                await stream.receive()
            except BaseException as exc:  # noqa: BLE001 - recorded and checked below
                caught.append(type(exc))

        tg.start_soon(reader)
        await anyio.sleep(0.05)
        await stream.aclose()  # a receive waiting on it ends with ClosedResourceError
    assert caught == [anyio.ClosedResourceError]
    with pytest.raises(anyio.ClosedResourceError):
        await stream.send(b"late")
    peer.close()


async def test_a_cancelled_receive_leaves_the_stream_usable() -> None:
    stream, peer = await pair()
    async with stream:
        with anyio.move_on_after(0.05):
            await stream.receive()
        peer.sendall(b"after\n")
        with anyio.fail_after(10):
            assert await stream.receive() == b"after\n"
    peer.close()


async def test_a_tap_takes_chunks_only_while_a_receive_waits_with_nothing_buffered() -> None:
    """`set_tap` (the relay's socket lane): a chunk arriving while a receive waits is offered
    to the tap; one arriving while an earlier chunk waits to be received is buffered behind
    it, so what is received keeps the peer's order; a chunk the tap declines is received."""
    stream, peer = await pair()
    tapped: list[bytes] = []
    stream.set_tap(lambda data: data.startswith(b"tap") and not tapped.append(data))
    got: list[bytes] = []

    async def receive_one() -> None:
        got.append(await stream.receive())

    async def waiting() -> None:
        while stream._protocol.read_waiter is None:
            await anyio.sleep(0.01)

    async with stream:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(receive_one)
                await waiting()
                peer.sendall(b"tap 1\n")  # through the real socket, to the tap
                while not tapped:
                    await anyio.sleep(0.01)
                peer.sendall(b"plain\n")  # declined by the tap: received
            assert tapped == [b"tap 1\n"] and got == [b"plain\n"]
            async with anyio.create_task_group() as tg:  # two chunks in one turn of the loop
                tg.start_soon(receive_one)
                await waiting()
                stream._protocol.data_received(b"first\n")
                stream._protocol.data_received(b"tap 2\n")
            assert got[1:] == [b"first\n"] and await stream.receive() == b"tap 2\n" and tapped == [b"tap 1\n"]
            stream.set_tap(None)
            async with anyio.create_task_group() as tg:  # no tap: everything is received
                tg.start_soon(receive_one)
                await waiting()
                peer.sendall(b"tap 3\n")
            assert got[2:] == [b"tap 3\n"] and tapped == [b"tap 1\n"]
    peer.close()


async def test_send_now_writes_at_once_while_open_and_refuses_after_the_end() -> None:
    stream, peer = await pair()
    async with stream:
        assert stream.send_now(b"at once\n")
        peer.settimeout(10)
        assert peer.recv(100) == b"at once\n"
        await stream.send_eof()
        assert not stream.send_now(b"too late\n")  # `send` raises here; this writes nothing
    assert not stream.send_now(b"closed\n")
    assert peer.recv(100) == b""  # EOF: nothing after the half-close reached the peer
    peer.close()
