"""The bounded server-sent-event splitter behind max_result_bytes on SSE and streamable HTTP
(toolatlas.upstream.bounded.BoundedEvents)."""

from __future__ import annotations

import pytest
from toolatlas.jsonlines import Oversized
from toolatlas.upstream.bounded import BoundedEvents

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile


def test_events_split_across_chunks_with_any_line_end() -> None:
    s = BoundedEvents(100)
    assert s.feed(b"event: message\r\ndata: {") == []
    assert s.feed(b'"a":1}\r') == []  # a "\r" that may be half of "\r\n"
    assert s.feed(b"\n\r\ndata: 2\n\ndata: 3\r\r: ping\r\n") == [
        b'event: message\ndata: {"a":1}\n\n', b"data: 2\n\n", b"data: 3\n\n",
    ]
    assert s.feed(b"\r\n") == [b": ping\n\n"]


def test_an_event_exactly_at_the_limit_is_kept() -> None:
    event = b"data: " + b"x" * 92 + b"\n\n"
    assert len(event) == 100
    assert BoundedEvents(100).feed(event) == [event]
    assert BoundedEvents(99).feed(event) == [Oversized(100, None)]


def test_an_oversized_event_is_reported_as_it_crosses_then_skipped() -> None:
    s = BoundedEvents(64)
    head = b'event: message\ndata: {"jsonrpc":"2.0","id":7,"result":{"text":"'
    assert s.feed(head) == []
    # Reported the moment it crosses the limit, before the event ends, with its id.
    assert s.feed(b"z" * 10) == [Oversized(len(head) + 10, 7)]
    assert s.feed(b"z" * 10_000) == []  # the rest streams by without being held
    assert s.feed(b'"}}\n\nevent: message\ndata: {"id":8}\n\n') == [b'event: message\ndata: {"id":8}\n\n']


def test_many_small_lines_count_towards_one_event() -> None:
    s = BoundedEvents(50)
    assert s.feed(b'data: {"id": "a",\n' + b"data: 1\n" * 4) == []
    assert s.feed(b"data: 1\n") == [Oversized(58, "a")]
    assert s.feed(b"\ndata: ok\n\n") == [b"data: ok\n\n"]
