"""Secrets never leave the daemon (issue #15 items 5 and 14): every value a `${VAR}` put into
an upstream's env, args, URL or headers is `[REDACTED]` in catalog_status reasons, in the
daemon's log lines, in its structured events and in execute_tool's error messages; and an
HTTP upstream answering 401 is reported as an authentication failure naming the header used,
never its value."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.daemon import Daemon
from tests.support.listener import RecordingListener

LEAKY = Path(__file__).resolve().parents[1] / "support" / "servers" / "leaky.py"
SECRETS = {
    "ENV_SECRET": "env-secret-71c3e9a0",
    "ARG_SECRET": "arg-secret-2b8d4f16",
    "URL_SECRET": "url-secret-9e05c7b3",
    "QUERY_SECRET": "query-secret-4a61d2e8",
    "HEADER_SECRET": "header-secret-c3f08b59",
}


def _upstreams(marker: Path, refusing_url: str) -> str:
    args = json.dumps([str(LEAKY), "--marker", str(marker), "--key=${ARG_SECRET}"])
    netloc = refusing_url.replace("http://", "http://op:${URL_SECRET}@")
    auth = 'headers = { Authorization = "Bearer ${HEADER_SECRET}" }\n'
    return (
        f'[[upstream]]\nname = "leaky"\ntransport = "stdio"\ncommand = "{sys.executable}"\nargs = {args}\n'
        'env = { TOKEN = "${ENV_SECRET}" }\n'
        f'[[upstream]]\nname = "locked"\ntransport = "http"\nurl = "{netloc}/mcp?key=${{QUERY_SECRET}}"\n{auth}'
        f'[[upstream]]\nname = "locked-sse"\ntransport = "sse"\nurl = "{netloc}/sse?key=${{QUERY_SECRET}}"\n{auth}'
        f'[[upstream]]\nname = "bare"\ntransport = "http"\nurl = "{refusing_url}/mcp"\n'
    )


def _leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def _leaky_down(d: Daemon) -> dict[str, Any] | None:
    servers = {s["name"]: s for s in d.status()["servers"]}
    return servers if "exited with code 3" in (servers["leaky"]["reason"] or "") else None


def _text(result: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in result.get("content", []))


@pytest.mark.timeout(120)
def test_secrets_are_redacted_from_status_logs_events_and_errors(tmp_path: Path) -> None:
    refusing = RecordingListener(status=401)
    d = Daemon(tmp_path, _upstreams(tmp_path / "crashed", refusing.url), daemon_extra='log_level = "DEBUG"\n')
    try:
        with d.start(env=SECRETS):
            crashed = d.tool("execute_tool", {"name": "leaky__crash", "arguments": {}})
            servers = d.wait_for(lambda: _leaky_down(d), 30, "the leaky upstream down with its stderr as the reason")
            failed = d.tool("execute_tool", {"name": "leaky__crash", "arguments": {}})
            status_text = json.dumps(d.status())
        log = d.log.read_text(errors="replace")
    finally:
        refusing.close()
    leaky = servers["leaky"]["reason"]
    assert "TOKEN=[REDACTED]" in leaky and "--key=[REDACTED]" in leaky, leaky
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
