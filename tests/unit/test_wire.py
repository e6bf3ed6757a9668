"""The line splitter behind the socket: limits without unbounded buffering."""

from __future__ import annotations

from toolatlas.meta_tools import clamp_top_k
from toolatlas.surface.wire import _LineSplitter
from toolatlas.errors import BadInput

import pytest


def test_lines_split_across_chunks() -> None:
    s = _LineSplitter(100)
    assert s.feed(b'{"a":') == []
    assert s.feed(b'1}\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert s.feed(b":3}\n") == [b'{"c":3}']


def test_oversized_line_is_dropped_and_reported_once_then_stream_recovers() -> None:
    s = _LineSplitter(10)
    assert s.feed(b"x" * 8) == []
    assert s.feed(b"x" * 8) == []  # now over the limit: discarding
    assert s.feed(b"x" * 1000) == []
    assert s.feed(b"xx\nok\n") == [None, b"ok"]
    assert s.feed(b"y" * 20 + b"\nfine\n") == [None, b"fine"]


@pytest.mark.parametrize(("given", "want"), [(None, 5), (0, 1), (-3, 1), (7, 7), (20, 20), (99, 20), (3.0, 3)])
def test_top_k_is_clamped(given: object, want: int) -> None:
    assert clamp_top_k(given) == want


@pytest.mark.parametrize("bad", ["5", 2.5, True, [1]])
def test_top_k_rejects_non_integers(bad: object) -> None:
    with pytest.raises(BadInput, match="top_k must be an integer"):
        clamp_top_k(bad)
