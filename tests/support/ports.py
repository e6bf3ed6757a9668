"""Ports for test servers: always 127.0.0.1, never a fixed number; one 2025-era HTTP POST."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (free when returned; bind it soon)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def legacy_post(port: int, secret: str, body: dict[str, Any], session: str | None = None) -> tuple[int, str | None]:
    """One 2025-11-25 streamable-HTTP POST to 127.0.0.1:`port`/mcp with bearer `secret`:
    (status, the Mcp-Session-Id answered)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    if session:
        headers |= {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    conn.request("POST", "/mcp", json.dumps(body), headers)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status, resp.getheader("mcp-session-id")
