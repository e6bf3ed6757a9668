"""A stdio MCP upstream written as plain JSON-RPC lines, for what an SDK server never sends.
Self-contained (standard library only): run it as a script.

    python rawrpc.py [--transport stdio|sse|http] [--host H] [--port P] [--broken-tools] [--many N]
        [--sessions]

Over SSE (the 2024-11-05 transport: a GET stream at /sse, POSTs to /messages) it serves one
client at a time; over streamable HTTP (POSTs to /mcp, JSON answers, no GET stream, no
session id) any number. Both print ``READY <port>``. It speaks the 2025-11-25 handshake (`server/discover` gets METHOD_NOT_FOUND, so an `auto`
client falls back to `initialize`) and answers `ping` and `tools/list`. A `tools/call`
answers by the tool's name:

- ``echo``: a text result echoing ``arguments.message``;
- ``pid``: a text result holding this process's pid;
- ``error32000``: a JSON-RPC error with code -32000, the first code of JSON-RPC's
  implementation-defined server-error range, which servers use for their own errors
  (``message`` is ``arguments.message``, or a quota message);
- ``error_without_message``: a JSON-RPC error object with a code and no ``message``;
- ``result_not_object``: a response whose ``result`` is a string;
- ``content_not_list``: a tool result whose ``content`` is a string;
- ``deep_result``: a tool result whose structuredContent nests 300 levels (JSON, but deeper
  than the MCP SDK's parser reads);
- ``progress_flood`` (stdio): ``arguments.count`` progress notifications for the call's
  progress token as fast as the pipe takes them, then touches ``arguments.done_file`` and
  answers;
- ``log_flood`` (stdio): ``arguments.count`` `notifications/message` log messages (level
  info) as fast as the pipe takes them, then answers;
- ``hang`` (streamable HTTP): answers with an event stream that sends one log message and
  then only keep-alive comments, never the answer, until the client closes it (a
  `notifications/cancelled` is ignored, as by a server whose tool is stuck);
- ``open_streams`` (streamable HTTP): how many ``hang`` streams are open now;
- ``close_stdout`` (stdio): closes its stdout without answering and keeps running, deaf to
  its stdin closing;
- ``http_503`` / ``http_html`` / ``not_json`` (streamable HTTP): answers with HTTP 503 and a
  text body, with a 200 login page (text/html), or with a 200 application/json body that is
  not JSON; over SSE ``http_503``'s message POST gets the 503;
- ``event_not_json`` (streamable HTTP): answers with an event stream whose one event is not JSON;
- ``gets`` (streamable HTTP, ``--sessions``): how many GETs it answered;
- ``hang_silent`` (streamable HTTP): sends nothing, not even its answer's headers, until the
  client closes the connection (``open_streams`` counts it too);
- ``drop`` (streamable HTTP): closes the connection without an answer;
- ``http_503_endless`` (streamable HTTP): a 503 whose text/html body never ends.

Over streamable HTTP a POST to another path than ``/mcp`` gets a 404 (a wrong URL); over SSE
a GET of another path than ``/sse`` gets an event stream that ends at once.

``--broken-tools`` adds to the listing what the SDK's model of a tool rejects (``BROKEN``);
``--endless-pages S`` (stdio) answers every tools/list, after S seconds, with one tool and a
next cursor: a listing that never ends (with ``--endless-after N``, the listings after the
first N; those end at once). ``--sessions`` (streamable HTTP) gives an ``Mcp-Session-Id`` at initialize and answers a GET
with 404, as a server that routes only POST does; ``--many N`` adds N plain tools
``filler_00000`` ... (1,500 make a page of over 256 KiB,
which the stdio transport parses in slices).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import select
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOLS = ("echo", "pid", "error32000", "error_without_message", "result_not_object", "content_not_list",
         "progress_flood", "log_flood", "hang", "open_streams", "close_stdout", "http_503", "http_html", "not_json",
         "event_not_json", "deep_result", "gets", "hang_silent", "drop", "http_503_endless")
# Listed as they are: tools the SDK's model of a tool rejects, and entries that cannot be a tool.
BROKEN: list[Any] = [
    {"name": "schema_string", "description": "inputSchema is a string", "inputSchema": "object"},
    {"name": "schema_missing", "description": "no inputSchema"},
    {"name": "schema_true", "description": "inputSchema is true", "inputSchema": True, "title": 5},
    {"name": "annotations_list", "description": "annotations is a list", "inputSchema": {"type": "object"},
     "annotations": ["readOnly"]},
    {"description": "no name", "inputSchema": {"type": "object"}},
    {"name": 7, "description": "a number for a name", "inputSchema": {"type": "object"}},
    "not a tool",
]
_LISTED: list[Any] = []
_ENDLESS: list[float] = []  # --endless-pages SECONDS [--endless-after N] (stdio): see the docstring
_LISTINGS: list[int] = []  # listings begun (a tools/list without a cursor)


_EVENTS: queue.Queue[str] | None = None  # over SSE: what the GET stream sends next
_REPLY = threading.local()  # over streamable HTTP: the POST's answer (`.msg`)
_HANGING = [0]  # under _LOCK
_SESSIONS = [False]  # --sessions
_GETS = [0]  # GETs answered 404 (--sessions), under _LOCK
_LOCK = threading.Lock()


def _send(msg: dict[str, Any]) -> None:
    if hasattr(_REPLY, "msg"):
        _REPLY.msg = msg
        return
    if _EVENTS is not None:
        _EVENTS.put(json.dumps(msg))
        return
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def _flood(id_: Any, token: Any, arguments: dict[str, Any]) -> None:
    count = int(arguments.get("count", 1000))
    for i in range(count):
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                                     "params": {"progressToken": token, "progress": i, "total": count}}) + "\n")
    sys.stdout.flush()
    with open(arguments["done_file"], "w", encoding="utf-8") as fh:
        fh.write("done")
    _send({"jsonrpc": "2.0", "id": id_, "result": _text(f"sent {count}")})


def _log_flood(id_: Any, count: int) -> None:
    for i in range(count):
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                     "params": {"level": "info", "data": f"line {i}"}}) + "\n")
    sys.stdout.flush()
    _send({"jsonrpc": "2.0", "id": id_, "result": _text(f"logged {count}")})


def _call(id_: Any, name: str, arguments: dict[str, Any], token: Any = None) -> None:
    if name == "progress_flood":
        _flood(id_, token, arguments)
    elif name == "log_flood":
        _log_flood(id_, int(arguments.get("count", 1000)))
    elif name == "echo":
        _send({"jsonrpc": "2.0", "id": id_, "result": _text(f"Echo: {arguments.get('message', '')}")})
    elif name == "pid":
        _send({"jsonrpc": "2.0", "id": id_, "result": _text(str(os.getpid()))})
    elif name == "error32000":
        message = arguments.get("message", "quota exceeded: try again in an hour")
        _send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32000, "message": message}})
    elif isinstance(name, str) and name.startswith(("schema_", "annotations_")):
        _send({"jsonrpc": "2.0", "id": id_, "result": _text(f"called {name} with {json.dumps(arguments)}")})
    elif name == "content_not_list":
        _send({"jsonrpc": "2.0", "id": id_, "result": {"content": "done", "isError": False}})
    elif name == "close_stdout":
        sys.stdout.flush()
        os.close(1)
        while True:
            time.sleep(1)
    elif name == "gets":
        _send({"jsonrpc": "2.0", "id": id_, "result": _text(str(_GETS[0]))})
    elif name == "open_streams":
        _send({"jsonrpc": "2.0", "id": id_, "result": _text(str(_HANGING[0]))})
    elif name == "error_without_message":
        _send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32001}})
    elif name == "result_not_object":
        _send({"jsonrpc": "2.0", "id": id_, "result": "done"})
    elif name == "deep_result":
        deep: Any = []
        for _ in range(300):
            deep = [deep]
        _send({"jsonrpc": "2.0", "id": id_, "result": {"content": [], "structuredContent": {"deep": deep}}})
    else:
        _send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32602, "message": f"unknown tool: {name}"}})


def _handle(msg: dict[str, Any]) -> None:
    method, id_ = msg.get("method"), msg.get("id")
    if method is None or id_ is None:
        return  # a response or a notification
    if method == "tools/list" and not (msg.get("params") or {}).get("cursor"):
        _LISTINGS.append(1)
    if method == "initialize":
        _send({"jsonrpc": "2.0", "id": id_, "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {"listChanged": False}, "logging": {}},
            "serverInfo": {"name": "rawrpc", "version": "1"}}})
    elif method == "ping":
        _send({"jsonrpc": "2.0", "id": id_, "result": {}})
    elif method == "tools/list" and _ENDLESS and len(_LISTINGS) > _ENDLESS[1]:
        time.sleep(_ENDLESS[0])  # a pager whose listing never ends: one more page each time
        page = int(((msg.get("params") or {}).get("cursor") or "0")) + 1
        _send({"jsonrpc": "2.0", "id": id_, "result": {"tools": [
            {"name": f"paged_{page:05d}", "description": "a tool of a listing that never ends",
             "inputSchema": {"type": "object"}}], "nextCursor": str(page)}})
    elif method == "tools/list":
        _send({"jsonrpc": "2.0", "id": id_, "result": {"tools": _LISTED}})
    elif method == "tools/call":
        params = msg.get("params") or {}
        _call(id_, params.get("name", ""), params.get("arguments") or {}, (params.get("_meta") or {}).get("progressToken"))
    else:
        _send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32601, "message": f"method not found: {method}"}})


class _Sse(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        assert _EVENTS is not None
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if self.path.partition("?")[0] != "/sse":
            return  # an event stream that ends before its endpoint event
        self.wfile.write(b"event: endpoint\ndata: /messages\n\n")
        self.wfile.flush()
        while True:
            try:
                data = _EVENTS.get(timeout=15)
            except queue.Empty:
                data = ""  # a keep-alive
            try:
                self.wfile.write(f"event: message\ndata: {data}\n\n".encode())
                self.wfile.flush()
            except OSError:
                return

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        msg = json.loads(body)
        if msg.get("method") == "tools/call" and (msg.get("params") or {}).get("name") == "http_503":
            status, text, content_type = _PLAIN["http_503"]  # this one message's POST fails
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()
        _handle(msg)

    def log_message(self, *args: Any) -> None:
        pass


# Streamable-HTTP answers that are not JSON-RPC: tool -> (status, body, Content-Type).
_PLAIN = {
    "http_503": (503, b"upstream overloaded, try later", "text/plain"),
    "http_html": (200, b"<html><body>Please log in</body></html>", "text/html"),
    "not_json": (200, b"{not json", "application/json"),
}


class _Http(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, body: bytes, content_type: str = "application/json",
                headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if _SESSIONS[0]:  # a server that routes only POST: what a GET gets from its framework
            with _LOCK:
                _GETS[0] += 1
            return self._answer(404, b"Cannot GET " + self.path.encode(), "text/plain")
        self._answer(405, b"no GET stream", "text/plain")

    def do_DELETE(self) -> None:  # noqa: N802
        self._answer(405, b"no sessions", "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if self.path.partition("?")[0] != "/mcp":
            return self._answer(404, b"Cannot POST " + self.path.encode(), "text/plain")
        tool = (msg.get("params") or {}).get("name") if msg.get("method") == "tools/call" else None
        if tool == "hang":
            return self._hang()
        if tool == "http_503_endless":  # an error page whose body never ends
            self.send_response(503)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            try:
                for _ in range(3000):
                    self.wfile.write(b"<p>busy</p>\n" * 100)
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            self.close_connection = True
            return None
        if tool == "drop":  # the connection closed without an answer (a worker that died, a proxy's reset)
            self.close_connection = True
            return None
        if tool == "hang_silent":  # no headers at all until the client closes the connection
            with _LOCK:
                _HANGING[0] += 1
            try:
                while not select.select([self.rfile], [], [], 0.2)[0]:
                    pass
            finally:
                with _LOCK:
                    _HANGING[0] -= 1
            self.close_connection = True
            return
        if tool in _PLAIN:
            return self._answer(*_PLAIN[tool])
        if tool == "event_not_json":
            return self._answer(200, b"event: message\ndata: {not json\n\n", "text/event-stream")
        _REPLY.msg = None
        try:
            _handle(msg)
            reply = _REPLY.msg
        finally:
            del _REPLY.msg
        if reply is None:
            return self._answer(202, b"", "text/plain")
        if _SESSIONS[0] and msg.get("method") == "initialize":
            return self._answer(200, json.dumps(reply).encode(), headers={"Mcp-Session-Id": "rawrpc-session"})
        self._answer(200, json.dumps(reply).encode())

    def _hang(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        log = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "working"}}
        with _LOCK:
            _HANGING[0] += 1
        try:
            self.wfile.write(f"event: message\ndata: {json.dumps(log)}\n\n".encode())
            for _ in range(3000):  # ten minutes at most
                self.wfile.flush()
                time.sleep(0.2)
                self.wfile.write(b": still working\n\n")
        except OSError:
            pass
        finally:
            with _LOCK:
                _HANGING[0] -= 1
            self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


def main() -> None:
    global _EVENTS
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", default="stdio", choices=["stdio", "sse", "http"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--broken-tools", action="store_true")
    parser.add_argument("--many", type=int, default=0)
    parser.add_argument("--sessions", action="store_true")
    parser.add_argument("--endless-pages", type=float, default=None)
    parser.add_argument("--endless-after", type=int, default=0)
    args = parser.parse_args()
    if args.endless_pages is not None:
        _ENDLESS.extend((args.endless_pages, args.endless_after))
    _SESSIONS[0] = args.sessions
    _LISTED.extend({"name": n, "description": f"rawrpc test tool {n}", "inputSchema": {"type": "object"}} for n in TOOLS)
    if args.broken_tools:
        _LISTED.extend(BROKEN)
    _LISTED.extend({"name": f"filler_{i:05d}", "description": f"filler tool number {i} of a long listing, " * 3,
                    "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}} for i in range(args.many))
    if args.transport == "stdio":
        for line in sys.stdin:
            if line.strip():
                _handle(json.loads(line))
        return
    if args.transport == "sse":
        _EVENTS = queue.Queue()
    ThreadingHTTPServer.request_queue_size = 256  # a test's hundred connections at once are not reset
    server = ThreadingHTTPServer((args.host, args.port), _Sse if args.transport == "sse" else _Http)
    server.daemon_threads = True
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
