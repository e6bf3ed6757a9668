"""A stdio MCP upstream written as plain JSON-RPC lines, for what an SDK server never sends.
Self-contained (standard library only): run it as a script.

    python rawrpc.py

It speaks the 2025-11-25 handshake (`server/discover` gets METHOD_NOT_FOUND, so an `auto`
client falls back to `initialize`) and answers `ping` and `tools/list`. A `tools/call`
answers by the tool's name:

- ``echo``: a text result echoing ``arguments.message``;
- ``pid``: a text result holding this process's pid;
- ``error32000``: a JSON-RPC error with code -32000, the first code of JSON-RPC's
  implementation-defined server-error range, which servers use for their own errors
  (``message`` is ``arguments.message``, or a quota message).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TOOLS = ("echo", "pid", "error32000")


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def _call(id_: Any, name: str, arguments: dict[str, Any]) -> None:
    if name == "echo":
        _send({"jsonrpc": "2.0", "id": id_, "result": _text(f"Echo: {arguments.get('message', '')}")})
    elif name == "pid":
        _send({"jsonrpc": "2.0", "id": id_, "result": _text(str(os.getpid()))})
    elif name == "error32000":
        message = arguments.get("message", "quota exceeded: try again in an hour")
        _send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32000, "message": message}})
    else:
        _send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32602, "message": f"unknown tool: {name}"}})


def _handle(msg: dict[str, Any]) -> None:
    method, id_ = msg.get("method"), msg.get("id")
    if method is None or id_ is None:
        return  # a response or a notification
    if method == "initialize":
        _send({"jsonrpc": "2.0", "id": id_, "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "rawrpc", "version": "1"}}})
    elif method == "ping":
        _send({"jsonrpc": "2.0", "id": id_, "result": {}})
    elif method == "tools/list":
        tools = [{"name": n, "description": f"rawrpc test tool {n}", "inputSchema": {"type": "object"}} for n in TOOLS]
        _send({"jsonrpc": "2.0", "id": id_, "result": {"tools": tools}})
    elif method == "tools/call":
        params = msg.get("params") or {}
        _call(id_, params.get("name", ""), params.get("arguments") or {})
    else:
        _send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32601, "message": f"method not found: {method}"}})


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            _handle(json.loads(line))


if __name__ == "__main__":
    main()
