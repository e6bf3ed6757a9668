"""End to end: a real `toolatlas serve` federating real upstreams over stdio, SSE and streamable
HTTP (the project's test server and npm's server-everything), driven by the real MCP SDK
client through the Unix socket and through `toolatlas shim`."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from tests.support.daemon import Daemon, everything_upstream, stdio_testserver, url_upstream
from tests.support.processes import descendants, pid_alive as alive
from tests.support.results import text as _text
from tests.support.servers import EVERYTHING_BIN as EVERYTHING, start_server
from toolatlas.surface.unix import unix_client

PASSTHROUGH = "passthrough-client"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    if not EVERYTHING.exists():
        pytest.fail("npm's server-everything is not installed: run `make npm` (make test does)")
    tmp = tmp_path_factory.mktemp("gw")
    sse = start_server("testserver", "sse", "--name", "beta")
    http = start_server("testserver", "http", "--name", "gamma")
    upstreams = (
        stdio_testserver("alpha", "--tools", "5", "--page-size", "3")
        + url_upstream("beta", "sse", sse.url)
        + url_upstream("gamma", "http", http.url)
        + stdio_testserver("slowpoke") + "timeouts = { call = 1.5 }\n"
        + everything_upstream()
    )
    d = Daemon(tmp, upstreams, daemon_extra=f'passthrough_clients = ["{PASSTHROUGH}"]')
    try:
        with d:
            d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "all upstreams ready")
            yield d
    finally:
        sse.stop()
        http.stop()


def _servers(d: Daemon) -> dict[str, dict]:
    return {s["name"]: s for s in d.status()["servers"]}


def test_discovery_across_all_transports_and_pagination(gateway: Daemon) -> None:
    servers = _servers(gateway)
    assert {n: s["transport"] for n, s in servers.items()} == {
        "alpha": "stdio", "beta": "sse", "gamma": "http", "slowpoke": "stdio", "everything": "stdio",
    }
    assert all(s["state"] == "ready" for s in servers.values())
    # alpha lists 9 built-in tools + 5 generated ones, 3 per page: all 5 pages were followed.
    assert servers["alpha"]["tools"] == 14
    assert servers["beta"]["tools"] == servers["gamma"]["tools"] == 9
    assert servers["everything"]["tools"] >= 10


async def _search_then_execute(client: Client) -> None:
    listed = await client.list_tools()
    assert sorted(t.name for t in listed.tools) == ["catalog_status", "execute_tool", "tool_search"]
    found = await client.call_tool("tool_search", {"query": "echo back a message", "top_k": 20})
    names = [m["name"] for m in found.structured_content["matches"]]
    assert "everything__echo" in names and "beta__echo" in names
    assert len(names) <= 20
    match = next(m for m in found.structured_content["matches"] if m["name"] == "everything__echo")
    assert match["inputSchema"]["properties"]["message"]
    result = await client.call_tool("execute_tool", {"name": "everything__echo", "arguments": {"message": "hi"}})
    assert not result.is_error
    assert _text(result) == "Echo: hi"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_search_then_execute_over_the_socket(gateway: Daemon, mode: str) -> None:
    with anyio.fail_after(30):
        async with Client(unix_client(gateway.socket), mode=mode) as client:
            await _search_then_execute(client)


def _cache_epoch(s: dict) -> tuple[object, ...]:
    """What in a catalog_status clears the daemon's result cache when it changes: the index
    version (a catalog commit), the dense branch coming up, a newly published learned state."""
    return s["index_version"], s["index"]["model"].get("phase"), s["index"]["embedder"], s["learning"]["events"]


def test_tool_search_takes_the_fast_lane_with_the_sdks_answers(gateway: Daemon) -> None:
    """The socket serves tool_search itself (surface.server.fast_lane); its replies must be
    the ones the SDK pipeline gives, and what it does not take (here: a request with a
    progress token) must still reach the SDK. The answers and the hit and miss counts hold
    only if nothing cleared the result cache meanwhile (the module's daemon may still be
    publishing an earlier test's learning or its dense branch on a loaded machine): such an
    attempt is repeated with new queries, at most three times."""
    for attempt in range(3):
        args = {"query": f"fast lane probe {attempt}: add two numbers", "top_k": 3}
        through_sdk: dict[str, dict] = {}
        fast: dict[str, dict] = {}
        cases = {
            "hit": args,
            "miss": {"query": f"fast lane probe {attempt}: echo a message back", "top_k": 2},
            "unknown server": {**args, "servers": ["nope"]},
            "bad top_k": {**args, "top_k": "three"},
            "empty query": {"query": " "},
        }
        start = gateway.status()
        with gateway.client() as c:
            # A connection's first call goes to the SDK: its handler records the negotiated
            # protocol version, which the lane needs to know before it takes a request.
            first = c.call_tool("tool_search", args)
            for name, a in cases.items():
                fast[name] = c.call_tool("tool_search", a)
                through_sdk[name] = c.request(
                    "tools/call", {"name": "tool_search", "arguments": a, "_meta": {"progressToken": name}}
                )
        end = gateway.status()
        if _cache_epoch(end) != _cache_epoch(start):
            continue  # the answers may differ across that change too (BM25's, then hybrid)
        before, after = start["cache"], end["cache"]
        assert fast == through_sdk
        assert first == fast["hit"]
        hit = fast["hit"]
        assert len(hit["structuredContent"]["matches"]) == 3 and not hit["isError"]
        assert len(fast["miss"]["structuredContent"]["matches"]) == 2
        assert json.loads(hit["content"][0]["text"]) == hit["structuredContent"]
        assert after["fast_lane"] - before["fast_lane"] == len(cases)
        assert "unknown server(s) nope" in fast["unknown server"]["content"][0]["text"]
        assert "top_k must be an integer" in fast["bad top_k"]["content"][0]["text"]
        assert "non-empty string `query`" in fast["empty query"]["content"][0]["text"]
        assert all(fast[k]["isError"] for k in ("unknown server", "bad top_k", "empty query"))
        assert (after["hits"] - before["hits"], after["misses"] - before["misses"]) == (3, 2)
        return
    pytest.fail("the result cache was cleared during each of three attempts")


async def test_the_sdk_client_accepts_fast_lane_answers(gateway: Daemon) -> None:
    before = gateway.status()["cache"]["fast_lane"]
    with anyio.fail_after(30):
        async with Client(unix_client(gateway.socket), mode="legacy") as client:
            args = {"query": "fast lane probe: echo a message back", "top_k": 4}
            first = await client.call_tool("tool_search", args)
            again = await client.call_tool("tool_search", args)
    assert gateway.status()["cache"]["fast_lane"] == before + 1  # the first call goes to the SDK
    assert again.structured_content == first.structured_content and not again.is_error
    assert len(again.structured_content["matches"]) == 4


async def test_search_then_execute_through_the_shim(gateway: Daemon) -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "toolatlas", "shim", "--socket", gateway.socket])
    with anyio.fail_after(30):
        async with Client(params) as client:
            await _search_then_execute(client)
            # A namespaced name can be called directly, over every transport's upstream.
            for server in ("alpha", "beta", "gamma"):
                direct = await client.call_tool(f"{server}__echo", {"message": server})
                assert _text(direct) == f"Echo: {server}"


async def test_progress_notifications_reach_the_client(gateway: Daemon) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with anyio.fail_after(30):
        async with Client(unix_client(gateway.socket)) as client:
            result = await client.call_tool(
                "execute_tool", {"name": "alpha__progress", "arguments": {"steps": 3}}, progress_callback=on_progress
            )
    assert _text(result) == "done"
    assert [p for p, _, _ in seen] == [1, 2, 3]
    assert seen[-1][2] == "step 3"


async def test_bad_input_gets_errors_a_model_can_act_on(gateway: Daemon) -> None:
    with anyio.fail_after(30):
        async with Client(unix_client(gateway.socket)) as client:
            r = await client.call_tool("execute_tool", {"name": "alpha__ecko", "arguments": {}})
            assert r.is_error and "alpha__echo" in _text(r)
            r = await client.call_tool("tool_search", {"query": "echo", "servers": ["nope"]})
            assert r.is_error and "unknown server" in _text(r) and "alpha" in _text(r)
            # alpha..gamma, slowpoke and everything hold 45+ tools matching these words.
            r = await client.call_tool("tool_search", {"query": "echo message tool number input seconds process", "top_k": 500})
            assert not r.is_error and len(r.structured_content["matches"]) == 20
            r = await client.call_tool("tool_search", {"query": "echo", "servers": ["gamma"]})
            assert {m["server"] for m in r.structured_content["matches"]} == {"gamma"}
            r = await client.call_tool("execute_tool", {"name": "beta__echo", "arguments": '{"message": "s"}'})
            assert _text(r) == "Echo: s"
            # Arguments are checked against the inputSchema: every problem, with its path.
            r = await client.call_tool("execute_tool", {"name": "beta__sleep", "arguments": {"seconds": "soon"}})
            assert r.is_error and "at /seconds:" in _text(r) and "'soon' is not of type 'number'" in _text(r)
            r = await client.call_tool("beta__echo", {})
            assert r.is_error and "'message' is a required property" in _text(r)


async def test_passthrough_client_sees_all_tools_and_list_changed(gateway: Daemon) -> None:
    changed = anyio.Event()

    async def on_message(message: object) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(message, types.ToolListChangedNotification):
            changed.set()
        elif isinstance(message, types.ToolListChangedNotification):
            changed.set()

    info = types.Implementation(name=PASSTHROUGH, version="1")
    with anyio.fail_after(60):
        async with Client(unix_client(gateway.socket), mode="legacy", client_info=info, message_handler=on_message) as client:
            # its list has no tool_search: its instructions said to call it first (the SDK read them before clientInfo)
            assert "Every tool is in tools/list" in (client.instructions or "") and "tool_search" not in (
                client.instructions or ""), client.instructions
            async with Client(unix_client(gateway.socket), client_info=info) as modern:  # server/discover (2026-07-28)
                assert "Every tool is in tools/list" in (modern.instructions or ""), modern.instructions
            listed = await client.list_tools()
            names = {t.name for t in listed.tools}
            assert {"alpha__echo", "beta__echo", "gamma__echo", "everything__echo"} <= names
            assert "tool_search" not in names
            async with Client(unix_client(gateway.socket)) as other:
                assert "first tool_search" in (other.instructions or ""), other.instructions
                await other.call_tool("alpha__add_tool", {"name": "kite_flyer", "description": "Fly a kite."})
            await changed.wait()
            again = await client.list_tools(cache_mode="refresh")
            assert "alpha__kite_flyer" in {t.name for t in again.tools}
    gateway.tool("alpha__remove_tool", {"name": "kite_flyer"})


def test_list_changed_makes_a_new_tool_searchable(gateway: Daemon) -> None:
    query = "paint zebra stripes onto a canvas"
    assert "alpha__zebra_painter" not in gateway.search(query)
    gateway.tool("alpha__add_tool", {"name": "zebra_painter", "description": "Paint zebra stripes onto a canvas."})
    gateway.wait_for(lambda: gateway.search(query)[:1] == ["alpha__zebra_painter"], 10, "new tool searchable")
    gateway.tool("alpha__remove_tool", {"name": "zebra_painter"})
    gateway.wait_for(lambda: "alpha__zebra_painter" not in gateway.search(query), 10, "removed tool gone")


async def test_hung_call_times_out_while_other_calls_proceed(gateway: Daemon) -> None:
    results: dict[str, types.CallToolResult] = {}

    finished: list[str] = []

    async def call(client: Client, name: str, args: dict) -> None:
        results[name] = await client.call_tool(name, args)
        finished.append(name)

    with anyio.fail_after(30):
        async with Client(unix_client(gateway.socket)) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, client, "slowpoke__hang", {})
                await anyio.sleep(0.1)
                tg.start_soon(call, client, "slowpoke__echo", {"message": "still here"})
    hang, echo = results["slowpoke__hang"], results["slowpoke__echo"]
    assert hang.is_error and "slowpoke" in _text(hang) and "1.5 s" in _text(hang) and "tools/call" in _text(hang)
    # the echo sent while the hang was in flight was answered first: calls do not queue behind it
    assert _text(echo) == "Echo: still here" and finished == ["slowpoke__echo", "slowpoke__hang"]
    # The session survived the timeout.
    assert gateway.tool("slowpoke__echo", {"message": "after"})["content"][0]["text"] == "Echo: after"


def test_malformed_and_oversized_messages_get_jsonrpc_errors(gateway: Daemon) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(gateway.socket)
        s.sendall(b"this is not json\n")
        s.sendall(b'{"hello": "world", "id": 7}\n')
        s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"x","params":"' + b"A" * (5 * 1024 * 1024) + b'"}\n')
        init = {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
        s.sendall(json.dumps(init).encode() + b"\n")
        f = s.makefile("rb")
        replies = [json.loads(f.readline()) for _ in range(4)]
    assert replies[0]["error"]["code"] == -32700
    assert replies[1]["error"]["code"] == -32600 and replies[1]["id"] == 7
    assert replies[2]["error"]["code"] == -32600 and "limit" in replies[2]["error"]["message"]
    assert replies[3]["id"] == 2 and replies[3]["result"]["serverInfo"]["name"] == "toolatlas"
    assert gateway.proc is not None and gateway.proc.poll() is None


def test_killed_upstream_recovers_and_others_are_unaffected(tmp_path: Path) -> None:
    upstreams = stdio_testserver("victim") + stdio_testserver("bystander")
    with Daemon(tmp_path, upstreams) as d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 30, "ready")
        old_pid = int(d.tool("victim__pid", {})["content"][0]["text"])
        # Its first child was started by the CLI beside the daemon's imports and taken by the pool.
        taken = re.search(r"upstream victim: took the child started early \(pid (\d+)\)", d.log.read_text())
        assert taken is not None and int(taken.group(1)) == old_pid, d.log.read_text()[-2000:]
        crashed = d.tool("victim__crash", {})  # the relay's path: it says how the child ended too
        assert crashed["isError"] and "lost its session during tools/call crash: stdio child exited with code 1 " \
            "(stderr: testserver: crashing with code 1)" in crashed["content"][0]["text"], crashed
        d.wait_for(lambda: _servers(d)["victim"]["state"] != "ready", 10, "victim leaves ready")
        # While it is down, its tools are not offered and say why, and the bystander is fine.
        assert all(n.startswith("bystander__") for n in d.search("echo a message", 10))
        assert d.tool("bystander__echo", {"message": "ok"})["content"][0]["text"] == "Echo: ok"
        down = d.tool("victim__echo", {"message": "x"})
        assert down["isError"] and "not available" in down["content"][0]["text"]
        d.wait_for(lambda: _servers(d)["victim"]["state"] == "ready", 30, "victim recovers")
        new_pid = int(d.tool("victim__pid", {})["content"][0]["text"])
        assert new_pid != old_pid and not alive(old_pid)
        assert _servers(d)["victim"]["reconnects"] >= 1
        # READY comes with the new session; its listing joins search once indexed (until then a
        # search says "being indexed"), a moment later and longer beside a CPU hog
        d.wait_for(lambda: "victim__echo" in d.search("echo a message", 10), 30, "victim's tools back in search")


def test_sigterm_shuts_down_cleanly_with_no_orphans(tmp_path: Path) -> None:
    upstreams = stdio_testserver("one") + stdio_testserver("two") + everything_upstream()
    d = Daemon(tmp_path, upstreams).start()
    d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "ready")
    assert d.proc is not None
    kids = descendants(d.proc.pid)
    assert len(kids) >= 3
    assert d.stop(signal.SIGTERM, timeout=30) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in kids):
        time.sleep(0.05)
    assert not [p for p in kids if alive(p)], "child processes outlived the daemon"
    assert not os.path.exists(d.socket)


def test_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    d = Daemon(tmp_path, stdio_testserver("solo"))
    os.makedirs(os.path.dirname(d.socket), exist_ok=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(d.socket)
    stale.close()  # the file stays behind, nobody listens
    with d:
        assert oct(os.stat(d.socket).st_mode & 0o777) == "0o660"
        assert d.search("echo")


def test_a_removed_socket_file_is_made_again(tmp_path: Path) -> None:
    """The socket file removed while the daemon runs (a /tmp cleaner ages it out: connecting
    does not touch it): the daemon listens on its path again, and new clients reach it, while
    a client connected before goes on. Before, every new client found nothing there, and a
    `shim --config` found the daemon's start lock held and waited in vain."""
    with Daemon(tmp_path, stdio_testserver("solo")) as d:
        with socket.socket(socket.AF_UNIX) as before:
            before.settimeout(30)
            before.connect(d.socket)
            os.unlink(d.socket)
            os.rmdir(os.path.dirname(d.socket))  # and its folder: a cleaner may take both
            d.wait_for(lambda: d.search("echo"), 30, "a new client served on the socket path again")
            assert oct(os.stat(d.socket).st_mode & 0o777) == "0o660"
            before.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n')
            assert json.loads(before.makefile("rb").readline()) == {"jsonrpc": "2.0", "id": 1, "result": {}}
        assert d.stop(signal.SIGTERM) == 0
    assert not os.path.exists(d.socket)

async def test_listen_streams_get_list_changed_only_when_their_list_changes(gateway: Daemon) -> None:
    """2026-07-28 clients: a passthrough client's subscriptions/listen stream hears the
    catalog change; a meta-tool client's does not (its three tools never change)."""
    heard: dict[str, int] = {"passthrough": 0, "meta": 0}
    info = types.Implementation(name=PASSTHROUGH, version="1")

    async def listen(client: Client, key: str, ready: anyio.Event) -> None:
        async with client.listen(tools_list_changed=True) as sub:
            ready.set()
            async for _event in sub:
                heard[key] += 1

    with anyio.fail_after(60):
        async with (
            Client(unix_client(gateway.socket), client_info=info) as pt,
            Client(unix_client(gateway.socket)) as meta,
            anyio.create_task_group() as tg,
        ):
            assert pt.protocol_version == "2026-07-28"
            names = {t.name for t in (await pt.list_tools()).tools}
            assert "alpha__echo" in names
            await meta.list_tools()
            r1, r2 = anyio.Event(), anyio.Event()
            tg.start_soon(listen, pt, "passthrough", r1)
            tg.start_soon(listen, meta, "meta", r2)
            await r1.wait()
            await r2.wait()
            await meta.call_tool("alpha__add_tool", {"name": "owl_counter", "description": "Count owls."})
            while heard["passthrough"] == 0:
                await anyio.sleep(0.02)
            await anyio.sleep(1.0)  # a spurious event to the meta client would have arrived by now
            assert heard["meta"] == 0
            again = await pt.list_tools(cache_mode="refresh")
            assert "alpha__owl_counter" in {t.name for t in again.tools}
            tg.cancel_scope.cancel()
    gateway.tool("alpha__remove_tool", {"name": "owl_counter"})
