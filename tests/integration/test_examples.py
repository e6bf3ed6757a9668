"""The bundled example servers, each on its default transport, driven through the pool."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types

from tests.support.configs import make_upstream, stdio_testserver
from tests.support.results import error_text, pool_call, structured
from toolatlas.catalog.model import ToolRecord
from toolatlas.upstream.pool import Pool
from toolatlas.upstream.state import UpstreamState


async def _ignore(_name: str, _tools: list[ToolRecord] | None) -> None:
    return None


async def test_examples_on_stdio_sse_and_http(spawn_server: Any) -> None:
    weather = spawn_server("weather", "sse")
    units = spawn_server("units", "http")
    ups = [
        make_upstream("notes", "stdio", command=sys.executable, args=["-m", "toolatlas.examples.notes"]),
        make_upstream("weather", "sse", url=weather.url),
        make_upstream("units", "http", url=units.url),
    ]
    tools: dict[str, list[ToolRecord]] = {}

    async def on_tools(name: str, listed: list[ToolRecord] | None) -> None:
        if listed is not None:
            tools[name] = listed

    with anyio.fail_after(60):
        pool = Pool(ups, on_tools)
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            await pool.wait_settled(45)
            assert {s.name: s.state for s in pool.status()} == dict.fromkeys(("notes", "weather", "units"), UpstreamState.READY)
            for name, listed in tools.items():
                assert 3 <= len(listed) <= 6, (name, [t.tool for t in listed])
                for tool in listed:
                    assert tool.description and len(tool.description) > 20, tool.name
                    assert tool.input_schema.get("type") == "object"

            added = structured(await pool_call(pool, 
                "notes", "add_note", {"title": "Groceries", "body": "oat milk and lemons", "tags": ["home"]}))
            hits = structured(await pool_call(pool, "notes", "search_notes", {"query": "LEMONS"}))["result"]
            assert [h["id"] for h in hits] == [added["id"]]
            assert structured(await pool_call(pool, "notes", "list_notes", {"tag": "work"}))["result"] == []
            await pool_call(pool, "notes", "delete_note", {"note_id": added["id"]})
            missing = await pool_call(pool, "notes", "get_note", {"note_id": added["id"]})
            assert f"no note with id {added['id']}" in error_text(missing)

            forecast = structured(await pool_call(pool, "weather", "get_forecast", {"city": "Oslo", "days": 2}))
            assert forecast["city"] == "Oslo" and len(forecast["days"]) == 2
            again = structured(await pool_call(pool, "weather", "get_forecast", {"city": "oslo", "days": 2}))
            assert again["days"] == forecast["days"]  # canned data is deterministic
            alerts = structured(await pool_call(pool, "weather", "get_alerts", {"city": "Oslo"}))
            assert alerts["alerts"] and alerts["alerts"][0]["event"] == "Snow"
            assert "known cities" in error_text(await pool_call(pool, "weather", "get_forecast", {"city": "Atlantis"}))

            km = structured(await pool_call(pool, "units", "convert_units", {"value": 1, "from_unit": "mi", "to_unit": "km"}))
            assert km["result"] == 1.609344
            assert structured(await pool_call(pool, "units", "calculate", {"expression": "2 * (3 + 4) ** 2"}))["result"] == 98
            assert structured(await pool_call(pool, 
                "units", "convert_temperature", {"value": 100, "from_scale": "c", "to_scale": "f"}))["result"] == 212
            refused = await pool_call(pool, "units", "calculate", {"expression": "__import__('os').system('true')"})
            assert "unsupported expression" in error_text(refused)
            mismatch = await pool_call(pool, "units", "convert_units", {"value": 1, "from_unit": "kg", "to_unit": "km"})
            assert "cannot convert mass" in error_text(mismatch)
            tg.cancel_scope.cancel()


async def test_testserver_pagination_and_generated_tools() -> None:
    from toolatlas.upstream.pool import list_tools_once

    tools = await list_tools_once(stdio_testserver("paged", "--tools", "7", "--page-size", "2"))
    names = [t.tool for t in tools]
    builtins = ["echo", "sleep", "hang", "crash", "greet_user", "pid", "progress", "add_tool", "remove_tool"]
    assert names[: len(builtins)] == builtins
    assert names[len(builtins) :] == [f"gen_{i:03d}" for i in range(7)]


def test_make_run_says_which_example_port_is_taken_and_starts_nothing(tmp_path: Path) -> None:
    """`make run` with an example server's port taken by another program: the example died
    with a bind traceback, the wait for its port was answered by that other program, and the
    daemon started and waited on an upstream that was not there. Now one line, exit 1."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        config = tmp_path / "example.toml"
        config.write_text(f'[daemon]\nsocket = "{tmp_path / "s.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
                          f'metrics_addr = ""\n[[upstream]]\nname = "weather"\ntransport = "sse"\n'
                          f'url = "http://127.0.0.1:{port}/sse"\n')
        proc = subprocess.Popen([sys.executable, "-m", "toolatlas.examples.run_example", str(config)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            _out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 1, err
    assert err.decode().strip() == (f"example server weather cannot listen on 127.0.0.1:{port} (Address already in "
                                    f"use): stop what uses that port, or give upstream 'weather' another url in {config}")
