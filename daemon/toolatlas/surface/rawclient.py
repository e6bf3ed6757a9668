"""A minimal JSON-RPC client for the daemon socket, stdlib only (the CLI's search/call/status).

It speaks the 2025-11-25 handshake; importing the SDK would cost over a second per command.
"""

from __future__ import annotations

import json
from typing import Any

from toolatlas import __version__
from toolatlas.jsonlines import BoundedLines, Oversized

PROTOCOL = "2025-11-25"
# A reply larger than this is refused, not buffered (a tool result passed through whole).
MAX_REPLY_BYTES = 64 * 1024 * 1024


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(f"{message} (JSON-RPC error {code})")


class RawClient:
    def __init__(self, path: str, timeout: float = 120.0, handshake_timeout: float | None = None) -> None:
        """`timeout`: seconds each reply may take; `handshake_timeout` (default: the same) for
        the answer to `initialize`, which a working daemon gives at once."""
        from toolatlas.surface.shim import connect

        self.path = path
        self.sock = connect(path, wait=1.0)
        self._wait(timeout if handshake_timeout is None else min(timeout, handshake_timeout))
        self._lines = BoundedLines(MAX_REPLY_BYTES)
        self._ready: list[bytes | Oversized] = []
        self._id = 0
        try:
            self.initialize_result: Any = self.request("initialize", {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "toolatlas-cli", "version": __version__},
            })
            self.notify("notifications/initialized")
        except BaseException:  # refused (a connection cap) or gone: never leak the socket
            self.sock.close()
            raise
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        self.timeout = timeout
        self.sock.settimeout(timeout)

    def _send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self._id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self._id, "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)
        while True:
            line = self._next_line()
            if isinstance(line, Oversized):
                if line.request_id in (self._id, None):
                    raise ConnectionError(
                        f"the daemon's reply of {line.size} bytes exceeds the {self._lines.limit}-byte limit"
                    )
                continue
            if not line.strip():
                continue
            reply = json.loads(line)
            if reply.get("id") is None and isinstance(reply.get("error"), dict):
                # not tied to a request: the daemon refused the connection (a cap) or ends it
                raise ConnectionError(f"the daemon ended the connection: {reply['error'].get('message', '')}")
            if reply.get("id") != self._id:
                continue  # a notification or a reply to someone else
            if "error" in reply:
                raise RpcError(reply["error"].get("code", 0), reply["error"].get("message", ""))
            return reply["result"]

    def _next_line(self) -> bytes | Oversized:
        while not self._ready:
            try:
                data = self.sock.recv(65536)
            except TimeoutError as exc:
                raise TimeoutError(f"the daemon at {self.path} accepted the connection but did not answer "
                                   f"within {self.timeout:g} s") from exc
            if not data:
                raise ConnectionError("the daemon closed the connection")
            self._ready = self._lines.feed(data)
        return self._ready.pop(0)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.request("tools/call", {"name": name, "arguments": arguments})
        return result

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
