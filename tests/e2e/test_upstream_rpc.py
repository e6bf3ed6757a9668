"""An upstream's JSON-RPC answers that an SDK server never sends, through a real daemon, on
both call paths over stdio, the raw relay (the default) and the SDK client
(`TOOLATLAS_RAW_RELAY=0`), and over SSE and streamable HTTP. The upstream is tests/support/servers/rawrpc.py,
plain JSON-RPC messages."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_relay import LEGACY, Wire
from tests.support.daemon import Daemon, url_upstream
from tests.support.servers import RAWRPC, rawrpc, start_server

UPSTREAM = (f'[[upstream]]\nname = "raw"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
            f"args = {json.dumps([str(RAWRPC)])}\ntimeouts = {{ call = 10 }}\n")


@pytest.fixture(scope="module", params=["relay", "sdk", "sse", "http"])
def daemon(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon over rawrpc on stdio, relaying or not (the SDK path), or on SSE or streamable
    HTTP (the SDK path)."""
    relay = request.param == "relay"
    web = start_server("rawrpc", request.param) if request.param in ("sse", "http") else None
    upstream = UPSTREAM if web is None else url_upstream("raw", request.param, web.url, "timeouts = { call = 10 }\n")
    d = Daemon(tmp_path_factory.mktemp(request.param), upstream, daemon_extra='log_level = "DEBUG"' if relay else "")
    try:
        with d.start(env={"TOOLATLAS_RAW_RELAY": "1" if relay else "0"}):
            d.wait_for(lambda: _raw(d)["state"] == "ready", 30, "raw ready")
            yield d
    finally:
        if web is not None:
            web.stop()


def _raw(d: Daemon) -> dict[str, Any]:
    return next(s for s in d.status()["servers"] if s["name"] == "raw")


def _call(d: Daemon, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One execute_tool on a plain socket (the relay takes it there), as its tool result."""
    w = Wire(d.socket, LEGACY)
    try:
        reply = json.loads(w.request(7, "tools/call", {"name": "execute_tool",
                                                       "arguments": {"name": f"raw__{tool}", "arguments": arguments}})[-1])
    finally:
        w.close()
    result: dict[str, Any] = reply["result"]
    return result


def test_an_upstream_error_with_code_32000_fails_that_call_and_keeps_the_session(daemon: Daemon) -> None:
    # -32000 is the first code of JSON-RPC's server-error range, which servers use for their
    # own errors; the SDK also uses it for "Connection closed". An upstream's own -32000 is
    # its answer to that call: the session, its child and its tools stay.
    pid = _call(daemon, "pid", {})["content"][0]["text"]
    before = _raw(daemon)
    r = _call(daemon, "error32000", {"message": "quota exceeded: try again in an hour"})
    assert r["isError"], r
    assert r["content"][0]["text"] == ("upstream 'raw' answered tools/call error32000 with JSON-RPC error -32000: "
                                       "quota exceeded: try again in an hour"), r
    after = _raw(daemon)
    assert after["state"] == "ready" and after["reconnects"] == before["reconnects"], after
    assert _call(daemon, "pid", {})["content"][0]["text"] == pid
    assert _call(daemon, "echo", {"message": "still here"})["content"][0]["text"] == "Echo: still here"
    _took_its_path(daemon)


def test_a_result_nested_deeper_than_the_sdk_reads_fails_its_call_at_once(daemon: Daemon) -> None:
    """A result nested 300 levels deep is JSON, but the MCP SDK's parser reads 200: on the SDK
    path (stdio, SSE) it was dropped as garbage and the call waited out its timeout ("did not
    answer"), and the relay said "ValueError: Maximum serialization depth exceeded"; both now
    fail it at once saying why. (Streamable HTTP: the SDK's own -32700 with pydantic's report,
    not changed here.)"""
    if daemon.tmp.name.startswith("http"):
        pytest.skip("streamable HTTP: the SDK's client parses the reply itself")
    r = _call(daemon, "deep_result", {})
    assert r["isError"], r
    assert r["content"][0]["text"] == ("tools/call deep_result on upstream 'raw' failed: the upstream's response is not "
                                       "valid JSON-RPC: it nests deeper than the 200 levels the MCP SDK reads"), r
    assert _raw(daemon)["state"] == "ready"


@pytest.mark.parametrize(("tool", "why"), [
    ("error_without_message", "its error has no `message`"),
    ("result_not_object", "its result is str, not an object"),
])
def test_a_response_that_is_not_json_rpc_fails_its_call_at_once_saying_why(daemon: Daemon, tool: str, why: str) -> None:
    # Not dropped as garbage, which left the call to wait out its timeout ("did not answer").
    r = _call(daemon, tool, {})
    assert r["isError"], r
    text = r["content"][0]["text"]
    # toolatlas's own words, not said to be the upstream's ("answered ... with JSON-RPC error -32603")
    assert text == f"tools/call {tool} on upstream 'raw' failed: the upstream's response is not valid JSON-RPC: {why}", text
    assert _raw(daemon)["state"] == "ready"
    assert _call(daemon, "echo", {"message": "after"})["content"][0]["text"] == "Echo: after"


def test_an_invalid_tool_result_is_reported_with_where_it_is_wrong(daemon: Daemon) -> None:
    # The error said only "ValidationError: 1 validation error for CallToolResult".
    r = _call(daemon, "content_not_list", {})
    assert r["isError"], r
    text = r["content"][0]["text"]
    assert text.startswith("upstream 'raw' sent an invalid result for tools/call content_not_list: ValidationError: "), text
    assert text.endswith("CallToolResult: content: Input should be a valid list"), text


def _took_its_path(d: Daemon) -> None:
    """The relay daemon (which logs at DEBUG) relayed the calls; the other did not."""
    relayed = d.log.read_text().count("tools/call relayed as ta-relay-")
    assert relayed > 0 if "log_level" in d.config.read_text() else relayed == 0


def _rawrpc(name: str, *args: str) -> str:
    return (f'[[upstream]]\nname = "{name}"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
            f"args = {json.dumps([str(RAWRPC), *args])}\n")


def test_a_listing_that_never_ends_says_it_was_still_paging_not_that_nothing_answered(tmp_path: Path) -> None:
    """An upstream answering every tools/list page quickly, each with a next cursor, ran out
    of timeouts.list_tools and read "did not answer tools/list within 2 s": the operator went
    looking for a hung server. The reason now says it was still paging and how far it got."""
    with Daemon(tmp_path, _rawrpc("pager", "--endless-pages", "0.05") + "timeouts = { list_tools = 2 }\n") as d:
        reason = d.wait_for(lambda: (s := d.status()["servers"][0])["state"] == "degraded" and s["reason"], 60,
                            "the listing given up")
        assert "upstream 'pager' was still paging tools/list when its 2 s ran out: " in reason, reason
        assert "pages (" in reason and "does its listing end?" in reason and "did not answer" not in reason, reason


def test_a_relist_that_never_ends_says_it_was_still_paging(tmp_path: Path) -> None:
    """The same for the periodic re-list: the first listing ends, the next pages on forever."""
    up = _rawrpc("pager", "--endless-pages", "0.05", "--endless-after", "1")
    with Daemon(tmp_path, up + "relist_interval = 1\ntimeouts = { list_tools = 2 }\n") as d:
        line = d.wait_for(lambda: next((ln for ln in d.log.read_text().splitlines() if "was still paging" in ln), None),
                          60, "the re-list given up")
        assert "upstream 'pager' was still paging tools/list when its 2 s ran out: " in line, line


@pytest.mark.timeout(120)
def test_a_broken_tool_in_a_listing_costs_only_that_tool(tmp_path: Path) -> None:
    # A tool whose inputSchema is a string, `true` or missing, or whose annotations are a list,
    # failed the SDK's model of the whole page: the upstream went DEGRADED ("ValidationError:
    # 5 validation errors for ListToolsResult") and none of its tools could be called. Now
    # each is repaired and reported; what cannot be a tool (no string name) is dropped. The
    # same on a page the stdio transport parses in slices (`big`: over 256 KiB).
    upstreams = _rawrpc("small", "--broken-tools") + _rawrpc("big", "--broken-tools", "--many", "1500")
    with Daemon(tmp_path, upstreams) as d:
        d.wait_for(lambda: {s["name"]: s["state"] for s in d.status()["servers"]} == {"small": "ready", "big": "ready"},
                   60, "both ready")
        for server in ("small", "big"):
            (status,) = [s for s in d.status()["servers"] if s["name"] == server]
            assert status["tools"] == len(rawrpc.TOOLS) + 4 + (1500 if server == "big" else 0), status
            problems = status["problems"]
            assert set(problems) == {"schema_string", "schema_missing", "schema_true", "annotations_list"}, problems
            assert problems["schema_string"].startswith("inputSchema is a string, not an object; replaced by an open "
                                                        "object schema"), problems
            assert problems["schema_missing"].startswith("inputSchema is missing; replaced"), problems
            assert "title is a number, not a string; removed" in problems["schema_true"], problems
            assert problems["annotations_list"] == "annotations is a list, not an object; removed", problems
            r = d.tool("execute_tool", {"name": f"{server}__schema_string", "arguments": {"x": 1}})
            assert r["content"][0]["text"] == 'called schema_string with {"x": 1}', r
            assert d.tool(f"{server}__echo", {"message": "hi"})["content"][0]["text"] == "Echo: hi"
        log = d.log.read_text()
        assert "dropped 'not a tool': not a tool object with a string name" in log, log[-3000:]


@pytest.mark.timeout(180)
def test_calls_abandoned_on_a_stream_that_never_ends_do_not_pile_up(tmp_path: Path) -> None:
    # A 2025-11-25 streamable-HTTP upstream whose tool is stuck keeps the call's event stream
    # open, ignoring the cancel. The SDK kept reading each one after its caller timed out:
    # the 100 connections of the upstream's pool filled, and the next request's pool timeout
    # ended the session (DEGRADED, every call on it failed). An abandoned call's stream is
    # now closed.
    web = start_server("rawrpc", "http")
    try:
        upstream = url_upstream("web", "http", web.url, "timeouts = { call = 0.5, connect = 5 }\nmax_concurrency = 8\n")
        with Daemon(tmp_path, upstream) as d:
            d.wait_for(lambda: _raw_named(d, "web")["state"] == "ready", 30, "web ready")
            for round_ in range(15):
                with ThreadPoolExecutor(8) as pool:
                    answers = list(pool.map(lambda _: d.tool("web__hang", {}), range(8)))
                for r in answers:
                    assert "did not answer tools/call hang within 0.5 s" in r["content"][0]["text"], (round_, r)
            assert _raw_named(d, "web")["state"] == "ready" and _raw_named(d, "web")["reconnects"] == 0
            d.wait_for(lambda: d.tool("web__open_streams", {})["content"][0]["text"] == "0", 30,
                       "the abandoned streams closed")
    finally:
        web.stop()


def _raw_named(d: Daemon, name: str) -> dict[str, Any]:
    return next(s for s in d.status()["servers"] if s["name"] == name)


@pytest.mark.timeout(120)
def test_a_child_that_closes_its_stdout_is_not_said_to_have_died_of_toolatlas_s_signal(tmp_path: Path) -> None:
    # The child closed its stdout and kept running; toolatlas stopped it (SIGTERM, after
    # the grace for stdin's close). The reason read "stdio child exited with signal 15", as
    # if something else had killed it.
    with Daemon(tmp_path, _rawrpc("raw")) as d:
        d.wait_for(lambda: _raw(d)["state"] == "ready", 30, "raw ready")
        r = d.tool("raw__close_stdout", {})
        assert r["isError"] and "lost its session" in r["content"][0]["text"], r
        why = "stdio child closed its stdout but kept running; toolatlas stopped it (signal 15)"
        d.wait_for(lambda: f"upstream raw: {why}; reconnect attempt 1" in d.log.read_text(), 30, "the reason logged")
        assert "exited with signal 15" not in d.log.read_text()
        d.wait_for(lambda: _raw(d)["state"] == "ready", 30, "raw ready again")


# Notifications a flood sends: the relay reads ~40,000 a second, the SDK path ~6,600 (its
# per-notification task); before the bound the relay held ~95 MB more at 300,000 and the SDK
# path ~950 MB at 100,000 (~240 MB at 25,000), both well past the 40 MB the test allows.
FLOOD = {"relay": 300_000, "sdk": 25_000}


def _peak_rss_mb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) // 1024


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", ["relay", "sdk"])
def test_a_progress_flood_to_a_caller_that_is_behind_is_held_within_bounds(tmp_path: Path, path: str) -> None:
    # A flood of progress notifications while the caller is not reading: the relay queued
    # each one, the SDK path held a task for each (FLOOD). Now a call's queue of progress
    # notifications is bounded, the newest always kept.
    upstream = _rawrpc("raw") + "timeouts = { call = 200 }\n"
    d = Daemon(tmp_path, upstream, daemon_extra='log_level = "DEBUG"' if path == "relay" else "")
    with d.start(env={"TOOLATLAS_RAW_RELAY": "1" if path == "relay" else "0"}):
        d.wait_for(lambda: _raw(d)["state"] == "ready", 30, "raw ready")
        assert d.proc is not None
        before = _peak_rss_mb(d.proc.pid)
        done = tmp_path / "flood.done"
        w = Wire(d.socket, LEGACY)
        w.sock.settimeout(200)
        try:
            w.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
                "name": "raw__progress_flood", "arguments": {"count": FLOOD[path], "done_file": str(done)},
                "_meta": {"progressToken": "p"}}})
            d.wait_for(done.exists, 120, "the upstream sent every notification")
            grown = _peak_rss_mb(d.proc.pid) - before
            lines = [json.loads(line) for line in w.until(9, deadline=200)]
        finally:
            w.close()
        assert lines[-1]["result"]["content"][0]["text"] == f"sent {FLOOD[path]}", lines[-1]
        progress = [m["params"]["progress"] for m in lines[:-1]]
        assert progress and progress[-1] == FLOOD[path] - 1, progress[-5:]
        disorder = [(i, a, b) for i, (a, b) in enumerate(zip(progress, progress[1:])) if b < a]
        assert not disorder, (len(progress), disorder[:5])
        assert grown < 40, f"the daemon's peak RSS grew {grown} MB while the caller was behind"
        _took_its_path(d)


@pytest.mark.timeout(240)
def test_a_client_that_stops_reading_does_not_stall_an_upstream_s_log_messages(tmp_path: Path) -> None:
    # A 2025-era client sets a log level and stops reading its socket; the upstream logs
    # 30,000 messages. Each waited up to 2 s on that client in a task of its own: the
    # daemon held ~125 MB more, the upstream's answer came 9 s late, and a 300,000-message
    # flood stalled its pipe until the health check ended the session. Now a client's
    # backlog of log messages is bounded; past it that client's are dropped.
    with Daemon(tmp_path, _rawrpc("raw") + "timeouts = { call = 200 }\n") as d:
        d.wait_for(lambda: _raw(d)["state"] == "ready", 30, "raw ready")
        assert d.proc is not None
        deaf = Wire(d.socket, LEGACY)
        try:
            deaf.request(2, "logging/setLevel", {"level": "info"})
            before = _peak_rss_mb(d.proc.pid)
            r = d.tool("raw__log_flood", {"count": 30_000})
            grown = _peak_rss_mb(d.proc.pid) - before
        finally:
            deaf.close()
        assert r["content"][0]["text"] == "logged 30000", r
        assert grown < 40, f"the daemon's peak RSS grew {grown} MB for a client that does not read"
        assert "is not reading: dropping upstream log messages for it" in d.log.read_text()
        assert _raw(d)["state"] == "ready"
