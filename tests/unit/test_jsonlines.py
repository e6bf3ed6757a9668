"""The one NDJSON line splitter (toolatlas.jsonlines) and the readers built on it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolatlas import jsonlines
from toolatlas.jsonlines import BoundedLines, Oversized, request_id_of


def test_lines_split_across_chunks() -> None:
    s = BoundedLines(100)
    assert s.feed(b'{"a":') == []
    assert s.feed(b'1}\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert s.feed(b":3}\n") == [b'{"c":3}']


def test_a_line_exactly_at_the_limit_is_kept() -> None:
    s = BoundedLines(10)
    assert s.feed(b"x" * 10 + b"\n") == [b"x" * 10]
    assert s.feed(b"x" * 11 + b"\n") == [Oversized(11, None)]


def test_oversized_line_is_dropped_and_reported_once_then_stream_recovers() -> None:
    s = BoundedLines(10)
    assert s.feed(b"x" * 8) == []
    assert s.feed(b"x" * 8) == []  # now over the limit: discarding
    assert s.feed(b"x" * 1000) == []
    assert s.feed(b"xx\nok\n") == [Oversized(1018, None), b"ok"]
    assert s.feed(b"y" * 20 + b"\nfine\n") == [Oversized(20, None), b"fine"]


def test_an_oversized_message_keeps_its_request_id() -> None:
    s = BoundedLines(64)
    big = b'{"jsonrpc": "2.0", "id": "req-7", "result": {"text": "' + b"z" * 500 + b'"}}\n'
    assert s.feed(big[:40]) == []
    assert s.feed(big[40:]) == [Oversized(len(big) - 1, "req-7")]
    assert s.feed(b'{"id": 12, "result": "' + b"q" * 100 + b'"}\n') == [Oversized(124, 12)]


@pytest.mark.parametrize(("head", "want"), [
    (b'{"jsonrpc":"2.0","id":-3,', -3),
    (b'{"id" : "a\\"b"', 'a"b'),
    (b'{"method":"notifications/progress","params":{', None),
    (b'{"id": null}', None),
])
def test_request_id_of(head: bytes, want: object) -> None:
    assert request_id_of(head) == want


def test_the_readers_share_the_one_splitter() -> None:
    from toolatlas.surface import rawclient, wire
    from toolatlas.upstream import transports

    for module in (wire, transports, rawclient):
        assert module.BoundedLines is jsonlines.BoundedLines, module.__name__


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[tuple[str, list[bytes]]]:
    """A socket that answers `initialize` normally, then sends each queued reply."""
    path = str(tmp_path / "fake.sock")
    replies: list[bytes] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            f = conn.makefile("rb")
            f.readline()  # initialize
            conn.sendall(b'{"jsonrpc": "2.0", "id": 1, "result": {}}\n')
            f.readline()  # notifications/initialized
            f.readline()  # the request under test
            for r in replies:
                conn.sendall(r)
            f.read()  # until the client closes

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path, replies
    listener.close()
    t.join(timeout=10)


def test_raw_client_refuses_a_reply_over_its_limit(
    fake_daemon: tuple[str, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolatlas.surface import rawclient

    path, replies = fake_daemon
    monkeypatch.setattr(rawclient, "MAX_REPLY_BYTES", 4096)
    replies.append(b'{"jsonrpc": "2.0", "method": "notifications/message", "params": {}}\n')
    replies.append(b'{"jsonrpc": "2.0", "id": 2, "result": {"blob": "' + b"b" * 100_000 + b'"}}\n')
    with rawclient.RawClient(path, timeout=10) as client:
        with pytest.raises(ConnectionError, match=r"reply of 1000\d\d bytes exceeds the 4096-byte limit"):
            client.request("tools/list")


def test_the_end_of_the_stream_ends_an_unfinished_last_line() -> None:
    s = BoundedLines(10)
    assert s.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert s.feed(b":2}", end=True) == [b'{"b":2}']
    assert s.feed(b"", end=True) == []  # nothing left
    assert s.feed(b"x" * 11, end=True) == [Oversized(11, None)]
