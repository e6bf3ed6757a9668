"""What the model reads, through a real daemon and the real SDK client (issue 18): template
overrides and their reload (a connected client hears tools/list_changed and re-lists the new
text; a bad template is refused and the running text stays), and the environment label in
every surface (meta-tool descriptions, instructions, catalog_status, events)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client

from tests.support.daemon import Daemon, stdio_testserver
from toolatlas.guidance import Domain, Guidance
from toolatlas.surface.unix import unix_client
from toolatlas.tokens import count_tokens, tools_list_json


def _search_text(listed: types.ListToolsResult) -> str:
    return next(t.description or "" for t in listed.tools if t.name == "tool_search")


def _events(d: Daemon, name: str) -> list[dict[str, Any]]:
    out = []
    for line in d.log.read_text().splitlines():
        if line.startswith("{") and f'"event":"{name}"' in line:
            out.append(json.loads(line))
    return out


async def test_template_override_reloads_on_sighup_and_clients_hear_list_changed(tmp_path: Path) -> None:
    tpl = tmp_path / "templates"
    tpl.mkdir()
    (tpl / "tool_search.md").write_text("FIRST: search the {environment} tools of {servers}.\n")
    d = Daemon(tmp_path, stdio_testserver("alpha"),
               daemon_extra=f'environment = "staging"\n[surface]\ntemplates = "{tpl}"\n')
    legacy_heard = anyio.Event()
    modern_heard = anyio.Event()

    async def on_message(message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            legacy_heard.set()

    async def listen(client: Client, ready: anyio.Event) -> None:
        async with client.listen(tools_list_changed=True) as sub:
            ready.set()
            async for _event in sub:
                modern_heard.set()

    with d, anyio.fail_after(120):
        async with (
            Client(unix_client(d.socket), mode="legacy", message_handler=on_message) as legacy,
            Client(unix_client(d.socket)) as modern,
            anyio.create_task_group() as tg,
        ):
            assert _search_text(await legacy.list_tools()) == "FIRST: search the staging tools of alpha."
            assert _search_text(await modern.list_tools()) == "FIRST: search the staging tools of alpha."
            # the texts the folder does not override are the shipped defaults, environment included
            listed = await legacy.list_tools(cache_mode="refresh")
            execute = next(t for t in listed.tools if t.name == "execute_tool")
            assert "staging gateway" in (execute.description or "") and "never guessed" in (execute.description or "")
            ready = anyio.Event()
            tg.start_soon(listen, modern, ready)
            await ready.wait()

            (tpl / "tool_search.md").write_text("SECOND: {environment} only.\n\n## parameter: query\nWhat you need.\n")
            assert d.proc is not None
            d.proc.send_signal(signal.SIGHUP)
            await legacy_heard.wait()
            await modern_heard.wait()
            again = await legacy.list_tools(cache_mode="refresh")
            assert _search_text(again) == "SECOND: staging only."
            query = next(t for t in again.tools if t.name == "tool_search").input_schema["properties"]["query"]
            assert query["description"] == "What you need."
            assert _search_text(await modern.list_tools(cache_mode="refresh")) == "SECOND: staging only."

            # A template with an unknown placeholder: the reload is refused, naming the file and
            # the placeholder, and clients keep the running text.
            (tpl / "tool_search.md").write_text("THIRD: {environmnet}.\n")
            d.proc.send_signal(signal.SIGHUP)
            with anyio.fail_after(30):
                while not _events(d, "config_reload_rejected"):
                    await anyio.sleep(0.05)
            reason = _events(d, "config_reload_rejected")[0]["reason"]
            assert "{environmnet}" in reason and str(tpl / "tool_search.md") in reason, reason
            assert _search_text(await legacy.list_tools(cache_mode="refresh")) == "SECOND: staging only."
            tg.cancel_scope.cancel()


async def test_two_daemons_side_by_side_are_told_apart_by_their_environment(tmp_path: Path) -> None:
    for env in ("production", "development"):
        (tmp_path / env).mkdir()
    daemons = {env: Daemon(tmp_path / env, stdio_testserver("alpha"), daemon_extra=f'environment = "{env}"\n')
               for env in ("production", "development")}
    with daemons["production"], daemons["development"], anyio.fail_after(120):
        seen: dict[str, str] = {}
        for env, d in daemons.items():
            async with Client(unix_client(d.socket), mode="legacy") as c:
                listed = await c.list_tools()
                assert {t.name for t in listed.tools} == {"tool_search", "execute_tool", "catalog_status"}
                for tool in listed.tools:
                    assert f"{env} gateway" in (tool.description or ""), (env, tool.description)
                assert env in (c.instructions or "") and "alpha" in (c.instructions or ""), c.instructions
                status = await c.call_tool("catalog_status", {})
                assert status.structured_content is not None and status.structured_content["environment"] == env
                await c.call_tool("tool_search", {"query": "echo"})
                seen[env] = _search_text(listed)
            shown = subprocess.run([sys.executable, "-m", "toolatlas", "status", "--socket", d.socket],
                                   capture_output=True, text=True, timeout=60)
            assert shown.stdout.splitlines()[0] == f"environment: {env}", shown.stdout
            searched = _events(d, "tool_search_completed")
            assert searched and all(e["environment"] == env for e in searched), searched
        # catalog_status.tokens counts the meta-tools as this caller reads them (templates in
        # force), and top-5 answers in json and compact form
        d = daemons["production"]
        tokens = d.wait_for(lambda: (t := d.status()["tokens"]) and "meta_tools_tokens" in t and t, 60, "token figures")
        with d.client() as raw:
            listed = raw.request("tools/list")["tools"]
        guidance = Guidance.load(None, "production")
        rendered = guidance.meta_tools(guidance.values(servers=["alpha"], domains=[Domain("alpha")], tool_count=0))
        assert [t["description"] for t in listed] == [t["description"] for t in rendered.tools]
        assert tokens["meta_tools_tokens"] == count_tokens(tools_list_json([dict(t) for t in rendered.tools])), tokens
        assert 0 < tokens["mean_top5_compact_tokens"] < tokens["mean_top5_search_result_tokens"], tokens
        # the same gateway, told apart from the text alone
        assert seen["production"] != seen["development"]
        assert seen["production"].replace("production", "development") == seen["development"]
