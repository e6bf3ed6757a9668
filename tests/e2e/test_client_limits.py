"""Connection caps, message and idle timeouts (#15 item 4): a local user cannot hold the daemon's
connections, and a stalled or slowloris peer on the socket or the HTTP endpoint is closed.
One daemon; every wait polls with a deadline (no timing is asserted)."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.ports import free_port

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
