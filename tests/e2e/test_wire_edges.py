"""Edges of the client surfaces that a hand-written or vanishing client meets: a last message
without its newline, requests sent before initialize, a 2025-11-25 HTTP session's client that
leaves mid-call. A real daemon, raw sockets, the real shim."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.daemon import Daemon, stdio_faultserver, stdio_testserver
from tests.support.ports import free_port
from toolatlas.surface.http import hash_token

TOKEN = "wire-edges-token"

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    port = free_port()
    http = (f'[http]\nlisten = "127.0.0.1:{port}"\n[[http.tokens]]\nname = "ops"\nsha256 = "{hash_token(TOKEN)}"\n'
            '[[access]]\ntokens = ["ops"]\nservers = ["*"]\n')
    with Daemon(tmp_path_factory.mktemp("wire-edges"), http + stdio_testserver("s") + stdio_faultserver("f")) as d:
        d.http_url = f"http://127.0.0.1:{port}/mcp"  # type: ignore[attr-defined]
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 30, "s and f ready")
        yield d


def _lines(*messages: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


def _replies_until_eof(sock: socket.socket) -> dict[Any, dict[str, Any]]:
    """Every reply the daemon writes until it closes its side (bounded by the socket's timeout)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return {m.get("id"): m for m in map(json.loads, data.splitlines())}


def test_a_last_message_without_its_newline_is_answered_on_the_socket(daemon: Daemon) -> None:
    """A client that writes its last message without a newline and half-closes (`printf ... |
    nc -U`, a writer that does not end its last line) gets its answer. Before, the daemon
    dropped the unfinished line at EOF and closed: the request was never answered."""
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "s__echo", "arguments": {"message": "m"}}}
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(daemon.socket)
        sock.sendall(_lines(INIT, INITIALIZED) + json.dumps(call).encode())
        sock.shutdown(socket.SHUT_WR)
        replies = _replies_until_eof(sock)
    assert sorted(replies) == [1, 2], replies
    assert replies[2]["result"]["content"][0]["text"] == "Echo: m", replies


def test_a_last_message_without_its_newline_is_answered_through_the_shim(daemon: Daemon) -> None:
    """The same through `toolatlas shim`: its stdin ending in an unfinished line is that line's
    end. Before, the shim dropped it and exited with no reply."""
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "s__echo", "arguments": {"message": "m"}}}
    r = subprocess.run([sys.executable, "-m", "toolatlas", "shim", "--socket", daemon.socket],
                       input=_lines(INIT, INITIALIZED) + json.dumps(call).encode(), capture_output=True, timeout=60)
    replies = {m["id"]: m for m in map(json.loads, r.stdout.splitlines())}
    assert r.returncode == 0 and sorted(replies) == [1, 2], (replies, r.stderr)
    assert replies[2]["result"]["content"][0]["text"] == "Echo: m", replies


def _exchange(daemon: Daemon, *messages: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    """Send `messages` on a fresh connection, half-close, and collect the replies by id."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(daemon.socket)
        sock.sendall(_lines(*messages))
        sock.shutdown(socket.SHUT_WR)
        return _replies_until_eof(sock)


def test_a_request_before_initialize_is_told_to_initialize_first(daemon: Daemon) -> None:
    """A hand-written client that skips the handshake is told to send initialize. Before, the
    SDK's answer was -32602 'Invalid request parameters' with empty data: it sent the reader
    looking for a fault in params that were fine."""
    call = {"name": "s__echo", "arguments": {"message": "m"}}
    replies = _exchange(daemon, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call},
                        {"jsonrpc": "2.0", "id": 3, "method": "ping"})
    for id_, method in ((1, "tools/list"), (2, "tools/call")):
        error = replies[id_]["error"]
        assert error["code"] == -32602, replies
        assert "not initialized" in error["message"] and "send `initialize`" in error["message"], error
        assert method in error["message"], error
    assert replies[3]["result"] == {}, replies  # ping needs no handshake


def test_params_the_sdk_refuses_are_said_by_field(daemon: Daemon) -> None:
    """An initialize without `clientInfo`, a resources/read without `uri`: the error names the
    field. Before, both were the SDK's bare 'Invalid request parameters'."""
    no_info = {"protocolVersion": "2025-11-25", "capabilities": {}}
    replies = _exchange(daemon, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": no_info}, INIT,
                        INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {}},
                        {"jsonrpc": "2.0", "id": 3, "method": "prompts/get", "params": {"name": 7}})
    assert replies[0]["error"]["message"] == "invalid params: initialize needs `params.clientInfo`", replies
    assert replies[2]["error"]["message"] == "invalid params: resources/read needs `params.uri`", replies
    assert replies[3]["error"]["message"].startswith("invalid params: prompts/get `params.name`: "), replies
    assert all(replies[i]["error"]["code"] == -32602 for i in (0, 2, 3)), replies


def _session(url: str) -> dict[str, str]:
    """A new 2025-11-25 session's request headers (initialized)."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    opened = httpx2.post(url, content=json.dumps(INIT).encode(), headers=headers, timeout=30)
    session = {**headers, "Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    httpx2.post(url, content=json.dumps(INITIALIZED).encode(), headers=session, timeout=30)
    return session


def _running(daemon: Daemon) -> None:
    daemon.wait_for(lambda: daemon.tool("f__stats", {})["structuredContent"]["inflight"] == 1, 30, "the call running")


def test_a_session_deleted_mid_call_tells_the_call_why_it_ended(daemon: Daemon) -> None:
    """A session's DELETE while one of its calls runs: the call's event stream carries an error
    for it saying the session ended and to send it again in a new one. Before, the stream just
    ended, empty, and a client waited for an answer or guessed why none came."""
    url = daemon.http_url  # type: ignore[attr-defined]
    session = _session(url)
    daemon.tool("f__reset_stats", {})
    call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "f__work", "arguments": {"seconds": 120}}}
    got: dict[str, str] = {}
    poster = threading.Thread(target=lambda: got.update(
        text=httpx2.post(url, content=json.dumps(call).encode(), headers=session, timeout=60).text))
    poster.start()
    try:
        _running(daemon)
        assert httpx2.delete(url, headers=session, timeout=30).status_code == 200
    finally:
        poster.join(60)
    events = [json.loads(line[5:]) for line in got["text"].splitlines() if line.startswith("data:")]
    assert [e["id"] for e in events] == [9], got
    assert "the session ended before this request was answered" in events[0]["error"]["message"], events
    assert daemon.tool("f__stats", {})["structuredContent"]["cancelled"] == 1


def test_a_session_call_whose_client_left_is_cancelled_upstream(daemon: Daemon) -> None:
    """A 2025-11-25 session's tools/call whose client closes its connection before the answer
    is cancelled upstream. Before, the SDK kept it running (a client may resume a stream, but
    with no event store none can), so the upstream call ran on to its end for no one."""
    url = daemon.http_url  # type: ignore[attr-defined]
    session = _session(url)
    daemon.tool("f__reset_stats", {})
    call = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                       "params": {"name": "f__work", "arguments": {"seconds": 120}}}).encode()
    port = int(url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        raw.sendall(b"POST /mcp HTTP/1.1\r\n" + f"Host: 127.0.0.1:{port}\r\nContent-Length: {len(call)}\r\n".encode()
                    + b"".join(f"{k}: {v}\r\n".encode() for k, v in session.items()) + b"\r\n" + call)
        _running(daemon)
    deadline = time.monotonic() + 30
    while (stats := daemon.tool("f__stats", {})["structuredContent"])["cancelled"] != 1:
        assert time.monotonic() < deadline, f"the call of a client that left was not cancelled: {stats}"
        time.sleep(0.1)
    assert stats["inflight"] == 0 and stats["completed"] == 0, stats

