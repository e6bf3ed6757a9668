"""A SIGHUP reload applies every security-relevant key or is refused: a bearer token removed
from the config stops working at once, and an [http] listen change is refused by name."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from tests.support.daemon import Daemon, stdio_testserver
from tests.support.ports import free_port

from toolatlas.surface.http import hash_token

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

KEEP, DROP = "token-that-stays", "token-that-is-removed"


def _section(port: int, *tokens: tuple[str, str]) -> str:
    out = f'[http]\nlisten = "127.0.0.1:{port}"\n'
    for name, secret in tokens:
        out += f'[[http.tokens]]\nname = "{name}"\nsha256 = "{hash_token(secret)}"\n'
    return out + '[[access]]\ntokens = ["keep", "drop"]\nservers = ["*"]\n'


def _status_code(url: str, secret: str) -> int:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {},
                  "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}}}).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": f"Bearer {secret}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/list"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _events(d: Daemon, name: str) -> list[dict]:  # type: ignore[type-arg]
    out = []
    for line in d.log.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            out.append(json.loads(line))
    return out


def test_removed_token_stops_working_and_listen_change_is_refused(tmp_path: Path) -> None:
    port = free_port()
    upstream = stdio_testserver("one")
    d = Daemon(tmp_path, _section(port, ("keep", KEEP), ("drop", DROP)) + upstream)
    url = f"http://127.0.0.1:{port}/mcp"
    with d:
        assert _status_code(url, KEEP) == 200 and _status_code(url, DROP) == 200
        base = d.config.read_text()
        d.config.write_text(base.replace(f'[[http.tokens]]\nname = "drop"\nsha256 = "{hash_token(DROP)}"\n', ""))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: _status_code(url, DROP) == 401, 30, "the removed token refused")
        assert _status_code(url, KEEP) == 200

        # moving the endpoint cannot be applied live: refused by name, the running config kept
        other = free_port()
        d.config.write_text(d.config.read_text().replace(f"127.0.0.1:{port}", f"127.0.0.1:{other}"))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        rejected = d.wait_for(lambda: _events(d, "config_reload_rejected"), 30, "reload refused")
        assert "[http] listen" in rejected[-1]["reason"]
        assert _status_code(url, KEEP) == 200 and _status_code(url, DROP) == 401
