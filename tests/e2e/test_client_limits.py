"""Connection caps, message and idle timeouts (#15 item 4): a local user cannot hold the daemon's
connections, and a stalled or slowloris peer on the socket or the HTTP endpoint is closed.
One daemon; every wait polls with a deadline (no timing is asserted)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.ports import free_port, legacy_post

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

TIMEOUT_S = 2  # [daemon] message_timeout for this daemon


def _unix(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)  # a bound on each read: the daemon must answer or close well before
    s.connect(path)
    return s


def _read_to_eof(s: socket.socket) -> bytes:
    data = b""
    for _ in range(1000):  # bounded; each recv waits at most the socket timeout
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"no EOF after {len(data)} bytes")


def _error(data: bytes) -> dict:
    (line,) = data.splitlines()
    return json.loads(line)["error"]


@pytest.mark.timeout(120)
def test_caps_per_uid_and_timeouts_for_stalled_peers(tmp_path: Path) -> None:
    port = free_port()
    d = Daemon(tmp_path, stdio_testserver("one") + f'[http]\nlisten = "127.0.0.1:{port}"\nanonymous = "dev"\n',
               daemon_extra=f"max_clients_per_uid = 3\nmessage_timeout = {TIMEOUT_S}")
    with d:
        # Three initialized sessions of this uid fill its share; the fourth is refused, saying why.
        held = [d.client() for _ in range(3)]
        try:
            refused = _unix(d.socket)
            err = _error(_read_to_eof(refused))
            assert err["code"] == -32000 and "max_clients_per_uid" in err["message"], err
            refused.close()
            # A client writes its initialize as soon as it connects, and still reads why it was
            # refused: the daemon reads it (not EPIPE on that write, nor a reset losing the line).
            eager = _unix(d.socket)
            assert select.select([eager], [], [], 30)[0], "no refusal written"
            eager.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}).encode() + b"\n")
            err = _error(_read_to_eof(eager))
            assert err["code"] == -32000 and "max_clients_per_uid" in err["message"], err
            eager.close()
            # ... but refused peers that stay open hold few of the daemon's descriptors meanwhile
            from toolatlas.surface.unix import REFUSALS_LINGERING
            pid = d.proc.pid  # type: ignore[union-attr]
            base = len(os.listdir(f"/proc/{pid}/fd"))
            stay = [_unix(d.socket) for _ in range(REFUSALS_LINGERING + 60)]
            for s in stay:  # each refused (its line written) before the count
                assert select.select([s], [], [], 30)[0], "no refusal written"
            assert len(os.listdir(f"/proc/{pid}/fd")) <= base + REFUSALS_LINGERING + 5
            for s in stay:
                s.close()
            # the CLI says so too, and exits 69 (unavailable)
            cli = subprocess.run([sys.executable, "-m", "toolatlas", "status", "--socket", d.socket],
                                 capture_output=True, text=True, timeout=60, check=False)
            assert cli.returncode == 69 and "max_clients_per_uid" in cli.stderr, (cli.returncode, cli.stderr)
            for _ in range(20):  # a peer hammering the full share: refused each time, logged once
                again = _unix(d.socket)
                assert _error(_read_to_eof(again))["code"] == -32000
                again.close()
            refusal_lines = [ln for ln in d.log.read_text().splitlines() if "client connection(s)" in ln]
            assert len(refusal_lines) <= 2, refusal_lines
            assert held[0].call_tool("catalog_status", {})["structuredContent"]["servers"][0]["name"] == "one"
        finally:
            for c in held:
                c.close()
        d.wait_for(lambda: d.status()["clients"] <= 1, 30, "held connections gone")  # served again

        # A peer that connects and sends nothing, and one that stops mid-message, are told and closed.
        silent, partial = _unix(d.socket), _unix(d.socket)
        partial.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "ini')
        for s in (silent, partial):
            err = _error(_read_to_eof(s))
            assert err["code"] == -32600 and "message_timeout" in err["message"], err
            s.close()

        # HTTP: a TCP connection that never completes its request headers is closed.
        for opening in (b"", b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"):
            tcp = socket.create_connection(("127.0.0.1", port), timeout=30)
            tcp.sendall(opening)
            assert _read_to_eof(tcp) == b""
            tcp.close()
        # ... and so is one whose request body stops coming after its headers (answered 408)
        tcp = socket.create_connection(("127.0.0.1", port), timeout=30)
        tcp.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                    "Accept: application/json, text/event-stream\r\nContent-Length: 200\r\n\r\n{\"jsonrpc\"".encode())
        answer = _read_to_eof(tcp)
        tcp.close()
        assert answer.startswith(b"HTTP/1.1 408 ") and b"message_timeout" in answer, answer
        assert d.status()["servers"][0]["state"] == "ready"  # and the daemon goes on
        assert "no complete request headers" in d.log.read_text()

        # idle_timeout (off by default) comes with a reload: a session quiet that long is closed.
        assert "idle_timeout" not in d.config.read_text()
        d.config.write_text(d.config.read_text().replace("message_timeout", f"idle_timeout = {TIMEOUT_S}\nmessage_timeout"))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: "config_reloaded" in d.log.read_text(), 30, "reload applied")
        quiet = _unix(d.socket)
        quiet.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode() + b"\n")
        reply, rest = _read_to_eof(quiet).split(b"\n", 1)
        assert json.loads(reply)["id"] == 1  # answered, then closed once idle
        err = _error(rest)
        assert err["code"] == -32600 and "idle_timeout" in err["message"], err
        quiet.close()


def _lines(s: socket.socket, count: int) -> list[dict]:
    """The next `count` JSON lines from `s` (each recv bounded by the socket's timeout)."""
    buf, out = b"", []
    for _ in range(10_000):
        while b"\n" in buf and len(out) < count:
            line, buf = buf.split(b"\n", 1)
            out.append(json.loads(line))
        if len(out) == count:
            return out
        chunk = s.recv(65536)
        assert chunk, f"closed after {out}"
        buf += chunk
    raise AssertionError(f"only {out}")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", ["relay", "sdk"])
def test_requests_in_flight_on_one_connection_are_bounded(tmp_path: Path, path: str) -> None:
    """A peer that pipelines requests without their replies coming back (here: calls that hang)
    cannot pile up work without bound: past MAX_IN_FLIGHT a request is refused at once, saying
    why, and a cancel frees a place. `sdk`: a client that declared elicitation, whose calls the
    SDK serves (the relay lane leaves them to it); `relay`: the socket's own call lane."""
    from toolatlas.surface.wire import MAX_IN_FLIGHT

    with Daemon(tmp_path, stdio_testserver("one")) as d:
        s = _unix(d.socket)
        caps = {"elicitation": {}} if path == "sdk" else {}
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": caps,
            "clientInfo": {"name": "pipeliner", "version": "1"}}}).encode() + b"\n")
        assert "result" in _lines(s, 1)[0]
        s.sendall(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        hang = [{"jsonrpc": "2.0", "id": i, "method": "tools/call",
                 "params": {"name": "execute_tool", "arguments": {"name": "one__hang", "arguments": {}}}}
                for i in range(1, MAX_IN_FLIGHT + 1)]
        s.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in hang))
        s.sendall(b'{"jsonrpc": "2.0", "id": "one-more", "method": "ping"}\n')
        (refused,) = _lines(s, 1)
        assert refused["id"] == "one-more" and refused["error"]["code"] == -32000, refused
        assert "in flight" in refused["error"]["message"], refused
        # a cancel is always read, and frees a place
        s.sendall(b'{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}\n')
        s.sendall(b'{"jsonrpc": "2.0", "id": "after-cancel", "method": "ping"}\n')
        (answered,) = _lines(s, 1)
        assert answered == {"jsonrpc": "2.0", "id": "after-cancel", "result": {}}, answered
        assert "requests in flight on one connection" in d.log.read_text()
        s.close()
        d.wait_for(lambda: d.status()["clients"] <= 1, 60, "the pipelining connection gone")


_NEW_ERA_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
                 "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}


def _http(port: int, secret: str, method: str, params: dict) -> bytes:  # type: ignore[type-arg]
    """One 2026-07-28 POST as raw HTTP/1.1 bytes."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": _NEW_ERA_META}})
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {secret}\r\n"
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: {method}\r\nContent-Length: {len(body)}\r\n\r\n{body}"
            ).encode()


def _open_stream(port: int, secret: str) -> socket.socket:
    """A `subscriptions/listen` event stream, its response started (200), left open."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(_http(port, secret, "subscriptions/listen", {"notifications": {"toolsListChanged": True}}))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200 "), head
    return s


def _list(port: int, secret: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(_http(port, secret, "tools/list", {}).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1))
        answer = _read_to_eof(s)
    return int(answer.split(b" ", 2)[1]), answer.split(b"\r\n\r\n", 1)[1]


@pytest.mark.timeout(120)
def test_one_http_principal_cannot_hold_every_connection(tmp_path: Path) -> None:
    """Event streams left open by one token count against its share (`max_clients_per_uid`,
    as a uid's on the socket): past it that token gets 429 saying why, while another token
    is served; ending one of its streams frees a place. (Before, one token could hold all
    `max_clients` connections and every other client got 503.)"""
    from toolatlas.surface.http import hash_token

    port = free_port()
    section = (f'[http]\nlisten = "127.0.0.1:{port}"\n'
               f'[[http.tokens]]\nname = "greedy"\nsha256 = "{hash_token("greedy-secret")}"\n'
               f'[[http.tokens]]\nname = "other"\nsha256 = "{hash_token("other-secret")}"\n')
    with Daemon(tmp_path, stdio_testserver("one") + section, daemon_extra="max_clients_per_uid = 2") as d:
        held = [_open_stream(port, "greedy-secret") for _ in range(2)]
        status, body = _list(port, "greedy-secret")
        assert status == 429, (status, body)
        error = json.loads(body)["error"]
        assert error["code"] == -32000 and "token:greedy" in error["message"], error
        assert "max_clients_per_uid" in error["message"], error
        assert _list(port, "other-secret")[0] == 200
        held.pop().close()
        d.wait_for(lambda: _list(port, "greedy-secret")[0] == 200, 30, "a place freed for the greedy token")
        for s in held:
            s.close()
        d.wait_for(lambda: d.status()["clients"] <= 1, 30, "the streams gone")
        # A burst whose bodies come late: each request's headers in (its 100 Continue says the
        # daemon waits for its body), then all the bodies at once. Still only the share is served.
        burst = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(8)]
        request = _http(port, "greedy-secret", "subscriptions/listen", {"notifications": {"toolsListChanged": True}})
        head, body = request.split(b"\r\n\r\n", 1)
        for s in burst:
            s.sendall(head + b"\r\nExpect: 100-continue\r\n\r\n")
        for s in burst:
            assert s.recv(4096).startswith(b"HTTP/1.1 100 "), "no 100 Continue"
        for s in burst:
            s.sendall(body)
        statuses = sorted(int(s.recv(4096).split(b" ", 2)[1]) for s in burst)
        assert statuses == [200, 200] + [429] * 6, statuses
        for s in burst:
            s.close()


def _new_session(port: int, secret: str) -> str:
    status, sid = legacy_post(port, secret, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "leaky", "version": "1"}}})
    assert status == 200 and sid, status
    return sid


def _ping_in(port: int, secret: str, sid: str) -> int:
    return legacy_post(port, secret, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, sid)[0]


@pytest.mark.timeout(120)
def test_one_http_principal_cannot_hold_every_session(tmp_path: Path) -> None:
    """A token that opens 2025-11-25 sessions and never ends them keeps its share
    (`max_clients_per_uid`) of them: opening one more ends its least recently used idle
    session (404 after), never one with its event stream open, nor another token's. (Before,
    it could fill the SDK's 10 000 sessions, and every other client's initialize got 503.)"""
    from toolatlas.surface.http import hash_token

    port = free_port()
    section = (f'[http]\nlisten = "127.0.0.1:{port}"\n'
               f'[[http.tokens]]\nname = "leaky"\nsha256 = "{hash_token("leaky-secret")}"\n'
               f'[[http.tokens]]\nname = "other"\nsha256 = "{hash_token("other-secret")}"\n')
    with Daemon(tmp_path, stdio_testserver("one") + section, daemon_extra="max_clients_per_uid = 2") as d:
        theirs = _new_session(port, "other-secret")
        streaming, idle = _new_session(port, "leaky-secret"), _new_session(port, "leaky-secret")
        stream = socket.create_connection(("127.0.0.1", port), timeout=30)
        stream.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer leaky-secret\r\n"
                       f"Accept: text/event-stream\r\nMcp-Session-Id: {streaming}\r\n"
                       "MCP-Protocol-Version: 2025-11-25\r\n\r\n".encode())
        assert stream.recv(4096).startswith(b"HTTP/1.1 200 ")
        newest = _new_session(port, "leaky-secret")
        assert _ping_in(port, "leaky-secret", idle) == 404  # ended to make room
        assert _ping_in(port, "leaky-secret", streaming) == 200  # older, but its stream is open
        assert _ping_in(port, "leaky-secret", newest) == 200
        assert _ping_in(port, "other-secret", theirs) == 200
        assert "ending the idle HTTP session" in d.log.read_text()
        stream.close()
