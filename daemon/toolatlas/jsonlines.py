"""The one newline-delimited JSON line splitter, for every byte stream toolatlas reads.

Used on the daemon socket (surface.wire), on a stdio upstream's stdout (upstream.transports)
and by the CLI's raw client (surface.rawclient). Stdlib only and cheap to import: the shim
and the CLI load it, and they must start in a few tens of milliseconds. Also the one
encoder of a JSON-RPC error line (`Refusal`), for the daemon's screens and the shim alike.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple, TypeGuard

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# Compiled on first use (re's cache keeps it): compiling costs the shim's start a few ms.
_ID_PATTERN = rb'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)'


# pydantic-core's JSON parser, the SDK's, refuses a message that nests deeper than this.
MAX_DEPTH = 200


def deeper_than(obj: Any, limit: int, *, containers: int | None = None) -> bool:
    """Whether decoded JSON `obj` nests arrays and objects more than `limit` levels deep (with
    `containers`: or holds more than that many arrays and objects; the walk stops there)."""
    stack = [(obj, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > limit or (containers is not None and seen > containers):
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


class Refusal(NamedTuple):
    """The JSON-RPC error a refused message is answered with."""

    code: int
    message: str
    id: str | int | None = None
    # A refused batch's request ids: answered as JSON-RPC 2.0 answers a batch, with an array
    # holding this error once for each (its notifications get nothing).
    batch: tuple[str | int, ...] = ()

    def payload(self) -> dict[str, Any] | list[dict[str, Any]]:
        error = {"code": self.code, "message": self.message}
        if self.batch:
            return [{"jsonrpc": "2.0", "id": rid, "error": error} for rid in self.batch]
        return {"jsonrpc": "2.0", "id": self.id, "error": error}

    def line(self) -> bytes:
        return json.dumps(self.payload()).encode() + b"\n"


class Oversized(NamedTuple):
    """A line that was over the limit: discarded, with the JSON-RPC id read off its start."""

    size: int
    request_id: str | int | None


def is_request_id(value: object) -> TypeGuard[str | int]:
    """Whether `value` can be a JSON-RPC request id here: a string or an integer, never a
    boolean (which Python counts as an integer)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def request_id_of(head: bytes) -> str | int | None:
    """The first `"id": ...` (a string or an integer) in the start of a message, or None."""
    m = re.search(_ID_PATTERN, head)
    if m is None:
        return None
    raw = m.group(1)
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, (str, int)) else None


class BoundedLines:
    """Splits a byte stream into lines without ever holding more than `limit` bytes of one.

    `feed(chunk)` returns the lines the chunk completed, without their newline. Chunks of a
    line are kept in a list and joined once (no quadratic re-copying); a line that grows past
    the limit is dropped as it streams in and comes out as one `Oversized`, keeping only its
    first `HEAD` bytes to find the JSON-RPC id it carries. The stream goes on after it.
    """

    HEAD = 512

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._head: bytes | None = None  # set while discarding an oversized line

    def __repr__(self) -> str:
        return f"<BoundedLines limit={self.limit} pending={self._size}>"

    @property
    def pending(self) -> bool:
        """Whether part of a line has arrived and its newline has not."""
        return self._size > 0

    def feed(self, data: bytes, *, end: bool = False) -> list[bytes | Oversized]:
        """The lines `data` completes; with `end` (the stream ended after `data`) an unfinished
        last line too (`printf` into `nc -U`, a writer that does not end its last message)."""
        out: list[bytes | Oversized] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            piece = data[start:] if nl < 0 else data[start:nl]
            self._take(piece)
            if nl < 0:
                if end and self.pending:
                    out.append(self._finish())
                return out
            out.append(self._finish())
            start = nl + 1

    def _take(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._head is not None:
            return
        if self._size > self.limit:
            self._head = (b"".join(self._parts) + piece)[: self.HEAD]
            self._parts = []
            return
        self._parts.append(piece)

    def _finish(self) -> bytes | Oversized:
        size, head = self._size, self._head
        self._size, self._head = 0, None
        if head is not None:
            return Oversized(size, request_id_of(head))
        line = b"".join(self._parts)
        self._parts = []
        return line
