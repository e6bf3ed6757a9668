"""Resources and prompts of an upstream that is down, through a real daemon and the SDK client:
a read or a prompt that would go to it says the upstream is down and to try again, not that
the resource or prompt is unknown (what a call of its tools says too)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support.daemon import Daemon
from tests.support.ports import free_port
from tests.support.servers import testserver_args
from toolatlas.surface.unix import unix_client


def _starts_once(name: str, flag: Path) -> str:
    """A stdio test server with resources that will not start again once `flag` exists."""
    server = shlex.join([sys.executable, *testserver_args("--name", name, "--resources", "2")])
    script = f"[ -e {shlex.quote(str(flag))} ] && exit 7; exec {server}"
    return f'[[upstream]]\nname = "{name}"\ntransport = "stdio"\ncommand = "sh"\nargs = {json.dumps(["-c", script])}\n'


async def _error(ask: object) -> str:
    with pytest.raises(MCPError) as caught:
        await ask  # type: ignore[misc]
    return str(caught.value)


async def test_a_read_or_prompt_of_an_upstream_that_is_down_says_so(tmp_path: Path) -> None:
    flag = tmp_path / "no-restart"
    never = f'[[upstream]]\nname = "never"\ntransport = "http"\nurl = "http://127.0.0.1:{free_port()}/mcp"\n'
    with Daemon(tmp_path, _starts_once("alpha", flag) + never) as d, anyio.fail_after(60):
        async with Client(unix_client(d.socket), mode="legacy") as client:
            assert (await client.read_resource("test://res/000")).contents[0].text == "resource 000"  # type: ignore[union-attr]
            await client.call_tool("execute_tool", {"name": "alpha__link", "arguments": {"name": "7"}})
            flag.touch()
            await client.call_tool("execute_tool", {"name": "alpha__crash", "arguments": {}})
            d.wait_for(lambda: d.status()["servers"][0]["state"] == "degraded", 30, "alpha down")
            down = "upstream 'alpha' is degraded ("
            plain = await _error(client.read_resource("test://res/000"))
            assert "is not offered by a server up now" in plain and down in plain and "try again later" in plain
            assert "never" not in plain  # it has never been up: nothing says it offers resources
            linked = await _error(client.read_resource("test://item/7"))
            assert linked.startswith("resource 'test://item/7' cannot be read now: " + down), linked
            qualified = await _error(client.read_resource("toolatlas://alpha/test://res/001"))
            assert qualified.startswith("resource 'toolatlas://alpha/test://res/001' cannot be read now: " + down)
            prompt = await _error(client.get_prompt("alpha__greet", {"name": "Bob"}))
            assert prompt.startswith("prompt 'alpha__greet' cannot be got now: " + down) and "try again later" in prompt
            # a name no server could own is still unknown
            assert "unknown prompt" in await _error(client.get_prompt("nope", {}))
            # a caller's name or URI is quoted cut, not whole: no reply grows with what was sent
            huge = "x" * 1_000_000
            for text in (await _error(client.read_resource(f"test://{huge}")),
                         await _error(client.read_resource(f"toolatlas://alpha/{huge}")),
                         await _error(client.get_prompt(f"nope__{huge}", {})),
                         await _error(client.get_prompt(f"alpha__{huge}", {}))):
                assert len(text) < 3000 and "xxx'..." in text, text[:200]
