"""The shim stays light and relays faithfully."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import Daemon, stdio_faultserver, stdio_testserver
from tests.support.results import text


def test_shim_imports_nothing_heavy() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, toolatlas.cli, toolatlas.surface.shim; print(' '.join(sys.modules))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    assert not {"numpy", "torch", "mcp", "onnxruntime", "sentence_transformers", "anyio"} & set(out)


def test_shim_without_a_daemon_fails_with_a_clear_message(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "toolatlas", "shim", "--socket", str(tmp_path / "none.sock")],
        input=b"", capture_output=True, timeout=30,
    )
    assert r.returncode == 1
    assert b"cannot reach the toolatlas daemon" in r.stderr and b"none.sock" in r.stderr


def test_shim_given_a_file_for_its_socket_says_it_is_no_socket(tmp_path: Path) -> None:
    config = tmp_path / "toolatlas.toml"
    config.write_text("[daemon]\n")
    r = subprocess.run([sys.executable, "-m", "toolatlas", "shim", "--socket", str(config)],
                       input=b"", capture_output=True, timeout=30)
    assert r.returncode == 1
    assert r.stderr.decode().splitlines() == [f"toolatlas shim: {config} is a regular file, not a socket: point "
                                              "--socket, $TOOLATLAS_SOCKET or the config's [daemon] socket at the "
                                              "daemon's socket"], r.stderr


def test_shim_relays_requests_and_replies_byte_for_byte(tmp_path: Path) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    lines = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
    payload = "".join(json.dumps(m) + "\n" for m in lines).encode()
    with Daemon(tmp_path, stdio_testserver("s")) as d:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolatlas", "shim", "--socket", d.socket],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        assert proc.stdin and proc.stdout
        proc.stdin.write(payload)
        proc.stdin.flush()
        replies = [json.loads(proc.stdout.readline()) for _ in range(2)]
        proc.stdin.close()  # the client goes away: the shim ends by itself
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()
    assert [m["id"] for m in replies] == [1, 2]
    assert sorted(t["name"] for t in replies[1]["result"]["tools"]) == ["catalog_status", "execute_tool", "tool_search"]


def test_a_client_that_closes_stdin_gets_the_replies_it_is_owed(tmp_path: Path) -> None:
    """A client that writes its requests and closes stdin (a pipe) is answered as one that
    stays: the shim half-closes the socket and waits, and the daemon finishes the calls in
    flight (the relay's, the SDK's and a search) instead of cutting them off."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    slow = {"name": "s__sleep", "arguments": {"seconds": 1}}
    lines = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": slow},  # the raw relay
             {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {**slow, "_meta": {"other": 1}}},  # the SDK
             {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
                 "name": "tool_search", "arguments": {"query": "sleep for a while", "top_k": 1}}}]
    payload = "".join(json.dumps(m) + "\n" for m in lines).encode()
    with Daemon(tmp_path, stdio_testserver("s")) as d:
        r = subprocess.run([sys.executable, "-m", "toolatlas", "shim", "--socket", d.socket],
                           input=payload, capture_output=True, timeout=60)
        # A peer that closes its socket is gone, not waiting: its call is cut off at once.
        gone = socket.socket(socket.AF_UNIX)
        gone.connect(d.socket)
        gone.settimeout(30)
        head, _, rest = payload.partition(b"\n")
        gone.sendall(head + b"\n")
        assert b'"id":1' in gone.recv(65536)  # answered: nothing more is written to it before the call ends
        gone.sendall(rest.replace(b'"seconds": 1', b'"seconds": 600'))
        seen = b""
        while b'"id":4' not in seen:  # the search, sent after the two calls: those are in flight now
            seen += gone.recv(65536) or b"EOF"  # bounded by the socket's timeout
        gone.close()
        d.wait_for(lambda: d.status()["clients"] == 1, 30, "the connection of the client that left closed")
    replies = {m["id"]: m for m in map(json.loads, r.stdout.splitlines())}
    assert r.returncode == 0 and sorted(replies) == [1, 2, 3, 4], (replies, r.stderr)
    for i in (2, 3):
        assert replies[i].get("result", {}).get("content", [{}])[0].get("text") == "slept 1 s", replies[i]
    assert replies[4]["result"]["structuredContent"]["matches"][0]["name"] == "s__sleep", replies[4]


def test_a_line_that_starts_with_a_byte_order_mark_is_answered(tmp_path: Path) -> None:
    """A client whose writer puts a UTF-8 BOM before its first line (as Windows tools
    writing "UTF-8 with BOM" do) is answered under its id. Before, the daemon refused the
    line as not JSON with id null, which no client can match: the initialize went unanswered."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    lines = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "s__echo", "arguments": {"message": "m"}}}]
    payload = b"".join(b"\xef\xbb\xbf" + json.dumps(m).encode() + b"\n" for m in lines)
    with Daemon(tmp_path, stdio_testserver("s")) as d:
        r = subprocess.run([sys.executable, "-m", "toolatlas", "shim", "--socket", d.socket],
                           input=payload, capture_output=True, timeout=60)
    replies = {m["id"]: m for m in map(json.loads, r.stdout.splitlines())}
    assert sorted(replies, key=str) == [1, 2], replies
    assert replies[1]["result"]["serverInfo"]["name"] == "toolatlas", replies
    assert replies[2]["result"]["content"][0]["text"] == "Echo: m", replies

def test_a_client_that_reuses_an_id_in_flight_gets_both_replies(tmp_path: Path) -> None:
    """Two requests in flight under one id (a client that reuses ids) are two requests owed:
    a client that closes stdin after them hears both answers, not only the first."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    lines = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": "x", "method": "tools/call", "params": {"name": "s__sleep", "arguments": {"seconds": 0}}},
             {"jsonrpc": "2.0", "id": "x", "method": "tools/call", "params": {"name": "s__sleep", "arguments": {"seconds": 2}}}]
    payload = "".join(json.dumps(m) + "\n" for m in lines).encode()
    with Daemon(tmp_path, stdio_testserver("s")) as d:
        r = subprocess.run([sys.executable, "-m", "toolatlas", "shim", "--socket", d.socket],
                           input=payload, capture_output=True, timeout=60)
    replies = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0, r.stderr
    texts = sorted(m["result"]["content"][0]["text"] for m in replies if m["id"] == "x")
    assert texts == ["slept 0 s", "slept 2 s"], replies

def test_a_client_killed_mid_call_ends_the_shim_and_the_upstream_call(tmp_path: Path) -> None:
    """A client that dies mid-call (both its pipes close) owes the shim nothing and reads no
    reply: the shim exits at once, and the daemon cancels the upstream call (its
    notifications/cancelled), instead of the shim waiting out the call's timeout."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "fs__work", "arguments": {"seconds": 600}}}

    def stats(d: Daemon) -> dict[str, int]:
        counts: dict[str, int] = json.loads(text(d.tool("fs__stats", {})))
        return counts

    with Daemon(tmp_path, stdio_faultserver("fs")) as d:
        proc = subprocess.Popen([sys.executable, "-m", "toolatlas", "shim", "--socket", d.socket],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdin and proc.stdout
        try:
            proc.stdin.write(json.dumps(init).encode() + b'\n{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == 1
            proc.stdin.write(json.dumps(call).encode() + b"\n")
            proc.stdin.flush()
            d.wait_for(lambda: stats(d)["inflight"] == 1, 30, "the call reached the upstream")
            proc.stdin.close()  # the client is killed: both its pipes close
            proc.stdout.close()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        got = d.wait_for(lambda: (s := stats(d))["cancelled"] == 1 and s["inflight"] == 0 and s, 30,
                         "the upstream call cancelled")
        assert got["completed"] == 0, got
