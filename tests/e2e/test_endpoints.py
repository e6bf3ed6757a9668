"""Named endpoints (issue 20 item 3): two [[endpoint]]s in one daemon, each with its own
socket (one also an HTTP path), upstream set, environment and templates, sharing one pool
and one index; each lists and searches only its own; catalog_status and metrics per
endpoint; the default socket and /mcp still serve everything."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.e2e.test_http_endpoint import _client
from tests.support.daemon import Daemon, stdio_testserver
from tests.support.ports import free_port
from toolatlas.surface.http import hash_token
from toolatlas.surface.rawclient import RawClient

TOKEN = "endpoint-test-token"


class Env:
    def __init__(self, d: Daemon, tmp: Path, port: int, metrics: int) -> None:
        self.d, self.tmp, self.port, self.metrics = d, tmp, port, metrics

    def sock(self, name: str) -> str:
        return str(self.tmp / "run" / f"{name}.sock")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("endpoints")
    port, metrics = free_port(), free_port()
    for t in ("tpl-prod", "tpl-dev"):
        (tmp / t).mkdir()
    (tmp / "tpl-dev" / "tool_search.md").write_text(
        "Search the {environment} tools ({tool_count} of them) before anything else.\n")
    cfg = (f'[http]\nlisten = "127.0.0.1:{port}"\n[[http.tokens]]\nname = "ci"\nsha256 = "{hash_token(TOKEN)}"\n'
           f'[[endpoint]]\nname = "prod"\nsocket = "{tmp / "run" / "prod.sock"}"\nupstreams = ["alpha"]\n'
           'environment = "production"\ntemplates = "tpl-prod"\n'
           f'[[endpoint]]\nname = "dev"\nsocket = "{tmp / "run" / "dev.sock"}"\nhttp_path = "/dev/mcp"\n'
           'upstreams = ["beta", "gamma"]\nenvironment = "development"\ntemplates = "tpl-dev"\n'
           + stdio_testserver("alpha") + stdio_testserver("beta") + stdio_testserver("gamma"))
    d = Daemon(tmp, cfg, daemon_extra=f'passthrough_clients = ["lister"]\nmetrics_addr = "127.0.0.1:{metrics}"\n')
    with d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "ready")
        yield Env(d, tmp, port, metrics)


def _socket_view(path: str) -> dict[str, Any]:
    with RawClient(path, timeout=60) as c:
        status = c.call_tool("catalog_status", {})["structuredContent"]
        found = c.call_tool("tool_search", {"query": "echo a message back", "top_k": 10})["structuredContent"]
        beta = c.call_tool("execute_tool", {"name": "beta__echo", "arguments": {"message": "hi"}})
    return {"servers": sorted(s["name"] for s in status["servers"]), "endpoint": status["endpoint"],
            "endpoints": status["endpoints"], "matched": sorted({m["server"] for m in found["matches"]}),
            "beta_ok": not beta.get("isError")}


def _passthrough_list(path: str) -> list[str]:
    """tools/list of a passthrough client (clientInfo "lister") on the socket at `path`."""
    with RawClient(path, timeout=60) as c:
        c.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "lister", "version": "1"}})
        return sorted({t["name"].split("__")[0] for t in c.request("tools/list", {})["tools"]})


def test_each_endpoint_serves_only_its_upstreams(env: Env) -> None:
    prod = _socket_view(env.sock("prod"))
    dev = _socket_view(env.sock("dev"))
    default = _socket_view(env.d.socket)
    assert prod["servers"] == prod["matched"] == ["alpha"] and not prod["beta_ok"]
    assert dev["servers"] == dev["matched"] == ["beta", "gamma"] and dev["beta_ok"]
    assert default["servers"] == default["matched"] == ["alpha", "beta", "gamma"]
    assert prod["endpoint"]["name"] == "prod" and prod["endpoint"]["environment"] == "production"
    assert prod["endpoint"]["templates"] == str(env.tmp / "tpl-prod")
    assert dev["endpoint"]["environment"] == "development" and dev["endpoint"]["http_path"] == "/dev/mcp"
    assert default["endpoint"]["name"] == "default" and default["endpoint"]["environment"] is None
    sections = {s["name"]: s for s in default["endpoints"]}
    assert sections["prod"]["upstreams"] == ["alpha"] and sections["dev"]["upstreams"] == ["beta", "gamma"]
    assert sections["prod"]["tools"] > 0 and sections["default"]["upstreams"] == ["alpha", "beta", "gamma"]
    assert _passthrough_list(env.sock("prod")) == ["alpha"]
    assert _passthrough_list(env.sock("dev")) == ["beta", "gamma"]
    # one pool: each upstream runs once, whatever the number of endpoints
    with env.d.client() as c:
        assert sorted(u["name"] for u in c.request("toolatlas/upstream/list", {})["upstreams"]) == [
            "alpha", "beta", "gamma"]


def _tool_search_text(path: str) -> str:
    with RawClient(path, timeout=60) as c:
        tools = c.request("tools/list", {})["tools"]
    return next(t["description"] for t in tools if t["name"] == "tool_search")


def test_each_endpoint_reads_its_own_environment_and_templates(env: Env) -> None:
    prod, dev, default = (_tool_search_text(p) for p in (env.sock("prod"), env.sock("dev"), env.d.socket))
    # prod: the shipped template with its environment; dev: its own template; default: the daemon's
    assert "REQUIRED FIRST STEP" in prod and "production gateway" in prod
    assert dev.startswith("Search the development tools (") and "REQUIRED FIRST STEP" not in dev
    assert "REQUIRED FIRST STEP" in default and "production" not in default and "development" not in default


def test_http_path_is_its_endpoint(env: Env) -> None:
    seen: dict[str, list[str]] = {}

    async def run() -> None:
        with anyio.fail_after(60):
            for path in ("/dev/mcp", "/mcp"):
                async with _client(f"http://127.0.0.1:{env.port}{path}", TOKEN) as c:
                    found = await c.call_tool("tool_search", {"query": "echo a message back", "top_k": 10})
                    seen[path] = sorted({m["server"] for m in found.structured_content["matches"]})
                    status = await c.call_tool("catalog_status", {})
                    assert status.structured_content["endpoint"]["name"] == ("dev" if path == "/dev/mcp" else "default")

    anyio.run(run)
    assert seen == {"/dev/mcp": ["beta", "gamma"], "/mcp": ["alpha", "beta", "gamma"]}
    assert httpx2.post(f"http://127.0.0.1:{env.port}/prod/mcp", json={}, timeout=30).status_code == 404


def test_metrics_and_audit_lines_per_endpoint(env: Env) -> None:
    _socket_view(env.sock("prod"))
    text = httpx2.get(f"http://127.0.0.1:{env.metrics}/metrics", timeout=30).text
    assert 'toolatlas_endpoint_requests_total{endpoint="prod",kind="tool_search"}' in text
    assert 'toolatlas_endpoint_requests_total{endpoint="dev",kind="call"}' in text
    assert 'toolatlas_endpoint_tools{endpoint="prod"}' in text and 'toolatlas_endpoint_clients{endpoint="dev"}' in text
    lines = [json.loads(x) for x in env.d.log.read_text().splitlines() if x.startswith('{"ts"')]
    searched = {e["endpoint"] for e in lines if e["event"] == "tool_search_completed"}
    assert {"prod", "dev", "default"} <= searched


def test_bad_endpoint_configs_are_refused(tmp_path: Path) -> None:
    from toolatlas.config import parse
    from toolatlas.errors import ConfigError

    up = '[[upstream]]\nname = "a"\ntransport = "stdio"\ncommand = "x"\n'
    for text, expect in [
        ('[[endpoint]]\nname = "p"\nupstreams = ["a"]\n', "neither a socket nor an http_path"),
        ('[[endpoint]]\nname = "p"\nsocket = "p.sock"\nupstreams = ["zzz"]\n', "unknown upstream 'zzz'"),
        ('[[endpoint]]\nname = "p"\nsocket = "p.sock"\nupstreams = []\n', "lists no upstreams"),
        ('[[endpoint]]\nname = "default"\nsocket = "p.sock"\nupstreams = ["a"]\n', "more than once"),
        ('[[endpoint]]\nname = "p"\nhttp_path = "/p"\nupstreams = ["a"]\n', "[http] listen is not set"),
        ('[[endpoint]]\nname = "p"\nsocket = "p.sock"\nupstreams = ["a"]\ntemplates = "nope"\n', "not a folder"),
    ]:
        with pytest.raises(ConfigError, match=None) as info:
            parse(up + text, source=str(tmp_path / "c.toml"))
        assert expect in str(info.value), (expect, str(info.value))


def test_reload_applies_upstreams_and_refuses_moving_an_endpoint(env: Env) -> None:
    original = env.d.config.read_text()
    try:
        env.d.config.write_text(original.replace('upstreams = ["alpha"]\nenvironment = "production"',
                                                 'upstreams = ["alpha", "gamma"]\nenvironment = "prod-eu"'))
        with env.d.client() as c:
            applied = c.request("toolatlas/reload", {})
        assert applied["applied"], applied
        prod = _socket_view(env.sock("prod"))
        assert prod["servers"] == prod["matched"] == ["alpha", "gamma"]
        assert prod["endpoint"]["environment"] == "prod-eu"
        env.d.config.write_text(original.replace("prod.sock", "prod2.sock"))
        with env.d.client() as c:
            refused = c.request("toolatlas/reload", {})
        assert refused["applied"] is False and "[[endpoint]]" in refused["error"], refused
        assert _socket_view(env.sock("prod"))["servers"] == ["alpha", "gamma"]  # the running config stayed
    finally:
        env.d.config.write_text(original)
        with env.d.client() as c:
            assert c.request("toolatlas/reload", {})["applied"]
    assert _socket_view(env.sock("prod"))["servers"] == ["alpha"]
