"""Secrets never leave the daemon (issue #15 items 5 and 14): every value a `${VAR}` put into
an upstream's env, args, URL or headers is `[REDACTED]` in catalog_status reasons, in the
daemon's log lines, in its structured events and in execute_tool's error messages; and an
HTTP upstream answering 401 is reported as an authentication failure naming the header used,
never its value. A secret a SIGHUP reload brings is redacted from then on."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.daemon import Daemon
from tests.support.listener import RecordingListener

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

LEAKY = Path(__file__).resolve().parents[1] / "support" / "servers" / "leaky.py"
SECRETS = {
    "ENV_SECRET": "env-secret-71c3e9a0",
    "ARG_SECRET": "arg-secret-2b8d4f16",
    "URL_SECRET": "url-secret-9e05c7b3",
    "QUERY_SECRET": "query-secret-4a61d2e8",
    "HEADER_SECRET": "header-secret-c3f08b59",
    "RELOAD_SECRET": "reload-secret-5d27a4c1",  # used only by the config a SIGHUP loads
}


def _leaky(name: str, marker: Path, token_var: str) -> str:
    args = json.dumps([str(LEAKY), "--marker", str(marker), "--key=${ARG_SECRET}"])
    return (f'[[upstream]]\nname = "{name}"\ntransport = "stdio"\ncommand = "{sys.executable}"\nargs = {args}\n'
            f'env = {{ TOKEN = "${{{token_var}}}" }}\n')


def _upstreams(marker: Path, refusing_url: str) -> str:
    netloc = refusing_url.replace("http://", "http://op:${URL_SECRET}@")
    auth = 'headers = { Authorization = "Bearer ${HEADER_SECRET}" }\n'
    return (
        _leaky("leaky", marker, "ENV_SECRET")
        + f'[[upstream]]\nname = "locked"\ntransport = "http"\nurl = "{netloc}/mcp?key=${{QUERY_SECRET}}"\n{auth}'
        f'[[upstream]]\nname = "locked-sse"\ntransport = "sse"\nurl = "{netloc}/sse?key=${{QUERY_SECRET}}"\n{auth}'
        f'[[upstream]]\nname = "bare"\ntransport = "http"\nurl = "{refusing_url}/mcp"\n'
    )


def _leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def _down(d: Daemon, name: str) -> dict[str, Any] | None:
    """catalog_status's servers by name once `name` is down with the leaky server's exit."""
    servers = {s["name"]: s for s in d.status()["servers"]}
    return servers if name in servers and "exited with code 3" in (servers[name]["reason"] or "") else None


def _text(result: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in result.get("content", []))


@pytest.mark.timeout(120)
def test_secrets_are_redacted_from_status_logs_events_and_errors(tmp_path: Path) -> None:
    refusing = RecordingListener(status=401)
    d = Daemon(tmp_path, _upstreams(tmp_path / "crashed", refusing.url), daemon_extra='log_level = "DEBUG"\n')
    try:
        with d.start(env=SECRETS):
            crashed = d.tool("execute_tool", {"name": "leaky__crash", "arguments": {}})
            servers = d.wait_for(lambda: _down(d, "leaky"), 30, "the leaky upstream down with its stderr as the reason")
            failed = d.tool("execute_tool", {"name": "leaky__crash", "arguments": {}})
            # a reload brings a new secret: it is redacted from then on, in the log lines too
            d.config.write_text(d.config.read_text() + _leaky("leaky-reloaded", tmp_path / "crashed", "RELOAD_SECRET"))
            d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
            reloaded = d.wait_for(lambda: _down(d, "leaky-reloaded"), 30, "the reloaded leaky upstream down")
            status_text = json.dumps(d.status())
        log = d.log.read_text(errors="replace")
    finally:
        refusing.close()
    leaky = servers["leaky"]["reason"]
    assert "TOKEN=[REDACTED]" in leaky and "--key=[REDACTED]" in leaky, leaky
    assert "TOKEN=[REDACTED]" in reloaded["leaky-reloaded"]["reason"], reloaded["leaky-reloaded"]
    assert crashed["isError"] and _leaks(_text(crashed)) == []
    assert failed["isError"] and "exited with code 3" in _text(failed), failed
    for name in ("locked", "locked-sse"):
        reason = servers[name]["reason"]
        assert "authentication failed (HTTP 401)" in reason and "'Authorization'" in reason, reason
    assert "no headers are configured" in servers["bare"]["reason"], servers["bare"]
    events = [json.loads(line) for line in log.splitlines() if line.startswith('{"ts"')]
    assert any("TOKEN=[REDACTED]" in json.dumps(e) and "--key=[REDACTED]" in json.dumps(e) for e in events)
    assert "TOKEN=[REDACTED]" in "\n".join(line for line in log.splitlines() if not line.startswith("{"))
    assert _leaks(leaky) == [] and _leaks(_text(failed)) == [] and _leaks(status_text) == []
    assert _leaks(log) == [], [line for line in log.splitlines() if _leaks(line)][:5]
