"""The toolatlas daemon's socket, as these stubs call it (standard library only).

Each call is a `tools/call` of the tool's namespaced name over the daemon's Unix socket, as
the calling process: the daemon reads the peer's uid and gid from the kernel, so its access
rules apply to whoever runs the code. One connection per process, opened on the first call.
The socket is `$TOOLATLAS_SOCKET` when set, else the one the stubs were generated against.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any, TypedDict

SOCKET = "@SOCKET@"
PROTOCOL = "2025-11-25"
TIMEOUT_S = 300.0


class ToolResult(TypedDict, total=False):
    """An MCP CallToolResult as the daemon returns it."""

    content: list[dict[str, Any]]
    structuredContent: dict[str, Any]
    isError: bool


class ToolError(Exception):
    """The tool answered isError (its text is the message), or the daemon refused the call."""

    def __init__(self, message: str, result: ToolResult | None = None) -> None:
        super().__init__(message)
        self.result = result


def text(result: ToolResult) -> str:
    """The text content blocks of `result`, joined."""
    return "".join(str(b.get("text", "")) for b in result.get("content", []) if b.get("type") == "text")


class _Connection:
    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(TIMEOUT_S)
        try:
            self._sock.connect(path)
        except OSError as exc:
            self._sock.close()
            raise ToolError(f"cannot reach the toolatlas daemon at {path}: {exc}") from exc
        self._buffer = b""
        self._id = 0
        self.request("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                    "clientInfo": {"name": "toolatlas-stubs", "version": "1"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, message: dict[str, Any]) -> None:
        self._sock.sendall(json.dumps(message).encode() + b"\n")

    def request(self, method: str, params: dict[str, Any]) -> Any:
        self._id += 1
        self._send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        while True:
            while b"\n" not in self._buffer:
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the toolatlas daemon closed the connection")
                self._buffer += chunk
            line, self._buffer = self._buffer.split(b"\n", 1)
            if not line.strip():
                continue
            reply = json.loads(line)
            if reply.get("id") != self._id:
                continue  # a notification
            if "error" in reply:
                raise ToolError(f"{method} refused: {reply['error'].get('message', '')}")
            return reply["result"]


_lock = threading.Lock()
_conn: _Connection | None = None


def call(name: str, arguments: dict[str, Any]) -> ToolResult:
    """Run tool `name` (namespaced: server__tool) with `arguments`; ToolError when the tool
    answers isError or the daemon refuses (an unknown tool, one the caller may not use)."""
    global _conn
    with _lock:
        if _conn is None:
            _conn = _Connection(os.environ.get("TOOLATLAS_SOCKET") or SOCKET)
        try:
            result: ToolResult = _conn.request("tools/call", {"name": name, "arguments": arguments})
        except (OSError, ValueError):
            _conn = None  # a broken connection is reopened by the next call
            raise
    if result.get("isError"):
        raise ToolError(f"{name}: {text(result)}", result)
    return result
