"""Edges of the socket's newline-delimited JSON-RPC that a hand-written client meets: a last
message without its newline, requests sent before initialize. A real daemon, raw sockets and
the real shim."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, stdio_testserver

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with Daemon(tmp_path_factory.mktemp("wire-edges"), stdio_testserver("s")) as d:
        d.wait_for(lambda: d.status()["servers"][0]["state"] == "ready", 30, "s ready")
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
