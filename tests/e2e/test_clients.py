"""Real MCP clients from npm against a real `toolatlas serve`: the MCP Inspector CLI and the
TypeScript SDK client, each through `toolatlas shim` (stdio) and through the streamable-HTTP
endpoint with a bearer token: list tools, tool_search, execute_tool. Also the Python SDK
through the shim in both protocol modes (tests/test_http_endpoint.py covers it over HTTP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO
from tests.support.daemon import Daemon, stdio_testserver
from tests.support.ports import free_port
from toolatlas.surface.http import hash_token

NPM = REPO / "tests" / "npm"
INSPECTOR_BUILD = NPM / "node_modules" / "@modelcontextprotocol" / "inspector-cli" / "build"
TS_SDK = NPM / "node_modules" / "@modelcontextprotocol" / "sdk"
TOKEN = "client-test-token"
META = ["tool_search", "execute_tool", "catalog_status"]

# A TypeScript SDK client: connects over stdio (argv: "stdio", command, ...args) or streamable
# HTTP (argv: "http", url, token), lists tools, searches, executes; prints one JSON object.
TS_CLIENT = r"""
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
const require = createRequire(process.env.TOOLATLAS_NPM + "/package.json");
const load = (p) => import(pathToFileURL(require.resolve(p)).href);
const { Client } = await load("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = await load("@modelcontextprotocol/sdk/client/stdio.js");
const { StreamableHTTPClientTransport } = await load("@modelcontextprotocol/sdk/client/streamableHttp.js");

const [mode, target, ...rest] = process.argv.slice(2);
const transport = mode === "stdio"
  ? new StdioClientTransport({ command: target, args: rest, stderr: "inherit" })
  : new StreamableHTTPClientTransport(new URL(target), {
      requestInit: { headers: { Authorization: `Bearer ${rest[0]}` } } });
const client = new Client({ name: "toolatlas-ts-test", version: "1.0.0" });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((t) => t.name);
const search = await client.callTool({ name: "tool_search", arguments: { query: "echo a message back", top_k: 3 } });
const exec = await client.callTool({ name: "execute_tool", arguments: { name: "alpha__echo", arguments: { message: "from typescript" } } });
console.log(JSON.stringify({
  protocolVersion: transport.protocolVersion ?? null,
  instructions: client.getInstructions() ?? null,
  tools,
  matches: search.structuredContent.matches.map((m) => m.name),
  exec: exec.content.map((c) => c.text).join(""),
  execIsError: exec.isError ?? false,
}));
await client.close();
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    if not (INSPECTOR_BUILD / "index.js").exists() or not TS_SDK.exists():
        pytest.fail("npm's inspector-cli / sdk are not installed: run `make npm` (make test does)")
    tmp = tmp_path_factory.mktemp("clients")
    port = free_port()
    http = (
        f'[http]\nlisten = "127.0.0.1:{port}"\n'
        f'[[http.tokens]]\nname = "clients"\nsha256 = "{hash_token(TOKEN)}"\n'
    )
    d = Daemon(tmp, http + stdio_testserver("alpha"))
    d.http_url = f"http://127.0.0.1:{port}/mcp"  # type: ignore[attr-defined]
    with d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstream ready")
        yield d


def _shim(d: Daemon) -> list[str]:
    return [sys.executable, "-m", "toolatlas", "shim", "--socket", d.socket]


def _inspector(target: list[str], *args: str) -> Any:
    """One Inspector CLI call; it only works when started from its own build/ folder."""
    proc = subprocess.run(
        ["node", "index.js", *target, *args], cwd=INSPECTOR_BUILD, capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 0, f"inspector failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def _inspector_targets(d: Daemon) -> dict[str, list[str]]:
    return {
        "shim": _shim(d),
        "http": [d.http_url, "--transport", "http", "--header", f"Authorization: Bearer {TOKEN}"],  # type: ignore[attr-defined]
    }


@pytest.mark.parametrize("via", ["shim", "http"])
def test_inspector_cli_lists_searches_and_executes(gw: Daemon, via: str) -> None:
    target = _inspector_targets(gw)[via]
    listed = _inspector(target, "--method", "tools/list")
    assert [t["name"] for t in listed["tools"]] == META
    found = _inspector(target, "--method", "tools/call", "--tool-name", "tool_search",
                       "--tool-arg", "query=echo a message back", "top_k=3")
    assert "alpha__echo" in [m["name"] for m in found["structuredContent"]["matches"]]
    done = _inspector(target, "--method", "tools/call", "--tool-name", "execute_tool",
                      "--tool-arg", "name=alpha__echo", 'arguments={"message": "from the inspector"}')
    assert not done.get("isError"), done
    assert done["content"][0]["text"] == "Echo: from the inspector"


def test_inspector_cli_without_token_is_refused(gw: Daemon) -> None:
    proc = subprocess.run(
        ["node", "index.js", gw.http_url, "--transport", "http", "--method", "tools/list"],  # type: ignore[attr-defined]
        cwd=INSPECTOR_BUILD, capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode != 0
    assert "a valid bearer token is required" in proc.stdout + proc.stderr


@pytest.mark.parametrize("via", ["shim", "http"])
def test_typescript_sdk_client(gw: Daemon, via: str, tmp_path: Path) -> None:
    script = tmp_path / "ts_client.mjs"
    script.write_text(TS_CLIENT)
    args = ["stdio", *_shim(gw)] if via == "shim" else ["http", gw.http_url, TOKEN]  # type: ignore[attr-defined]
    proc = subprocess.run(
        ["node", str(script), *args], capture_output=True, text=True, timeout=90,
        env=dict(os.environ, TOOLATLAS_NPM=str(NPM)),
    )
    assert proc.returncode == 0, f"TypeScript client failed:\n{proc.stdout}\n{proc.stderr}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tools"] == META
    assert "alpha__echo" in out["matches"]
    assert out["exec"] == "Echo: from typescript" and not out["execIsError"]
    assert "alpha" in (out["instructions"] or "")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_python_sdk_client_through_the_shim(gw: Daemon, mode: str) -> None:
    import anyio
    import mcp_types as types
    from mcp import Client, StdioServerParameters

    shim = _shim(gw)
    with anyio.fail_after(60):
        async with Client(StdioServerParameters(command=shim[0], args=shim[1:]), mode=mode) as c:
            assert c.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
            assert [t.name for t in (await c.list_tools()).tools] == META
            found = await c.call_tool("tool_search", {"query": "echo a message back", "top_k": 3})
            assert "alpha__echo" in [m["name"] for m in found.structured_content["matches"]]
            done = await c.call_tool("execute_tool", {"name": "alpha__echo", "arguments": {"message": "py"}})
            text = "".join(b.text for b in done.content if isinstance(b, types.TextContent))
            assert not done.is_error and text == "Echo: py"
