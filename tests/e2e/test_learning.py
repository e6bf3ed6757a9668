"""Retrieval that learns from use (issue 17), on real daemons sharing one state_dir.

A search then a successful execute of its third result is a usage event that survives a
restart and lifts that tool; an isError result, a refused call and a direct call record
nothing; one principal's 500 events leave another principal's ranking as it was;
`toolatlas learning show|forget|reset` see and wipe the store (the running daemon notices);
a tool removed from its upstream leaves no trace in results.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.daemon import Daemon, stdio_example, stdio_testserver
from tests.support.ports import free_port
from toolatlas.surface.http import hash_token

TOKEN = "s3cret-other-user"
QUERY = "generated test tool"
N_GEN = 8


def _config(port: int) -> str:
    return (
        f'[http]\nlisten = "127.0.0.1:{port}"\n'
        f'[[http.tokens]]\nname = "other"\nsha256 = "{hash_token(TOKEN)}"\n'
        '[[access]]\ntokens = ["other"]\nservers = ["*"]\n'
        + stdio_testserver("t", "--tools", str(N_GEN))
        + stdio_example("notes")
    )


def _cli(d: Daemon, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "toolatlas", "learning", *args, "--config", str(d.config), "--json"],
                         capture_output=True, text=True, timeout=60, check=True)
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def _events(d: Daemon) -> int:
    n: int = d.status()["learning"]["events"]
    return n


def _execute(d: Daemon, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return d.tool("execute_tool", {"name": name, "arguments": args})


@asynccontextmanager
async def _other(url: str) -> AsyncIterator[Client]:
    """An SDK client over HTTP as the principal `token:other`."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http)) as c:
            yield c


def _other_search(url: str, query: str) -> list[str]:
    async def go() -> list[str]:
        with anyio.fail_after(60):
            async with _other(url) as c:
                res = await c.call_tool("tool_search", {"query": query, "top_k": 5})
                return [m["name"] for m in json.loads(res.content[0].text)["matches"]]

    return anyio.run(go)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    yield tmp_path_factory.mktemp("learning"), free_port()


def _daemon(home: tuple[Path, int]) -> Daemon:
    tmp, port = home
    d = Daemon(tmp, _config(port))
    d.http_url = f"http://127.0.0.1:{port}/mcp"  # type: ignore[attr-defined]
    return d


def test_feedback_survives_a_restart_and_failures_record_nothing(home: tuple[Path, int]) -> None:
    with _daemon(home) as d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstreams ready")
        assert d.status()["learning"] == {"enabled": True, "events": 0, "tools_with_feedback": 0, "updated_at": None}
        before = d.search(QUERY)
        assert len(before) == 5 and all(n.startswith("t__gen_") for n in before), before
        third = before[2]
        # a direct namespaced call without a search records nothing
        assert not d.tool(third, {"value": "direct"}).get("isError")
        # an isError result and a refused call after a search record nothing either
        with d.client() as c:
            found = [m["name"] for m in c.call_tool("tool_search", {"query": "read one note in full by its id"})
                     ["structuredContent"]["matches"]]
            assert "notes__get_note" in found
            bad = c.call_tool("execute_tool", {"name": "notes__get_note", "arguments": {"note_id": 987654}})
            assert bad.get("isError"), bad
            c.call_tool("tool_search", {"query": QUERY})
            refused = c.call_tool("execute_tool", {"name": third, "arguments": {"value": 5}})
            assert refused.get("isError") or "error" in refused, refused
            # the one that counts: search, then execute its third result successfully
            again = [m["name"] for m in c.call_tool("tool_search", {"query": QUERY})["structuredContent"]["matches"]]
            assert again == before
            ok = c.call_tool("execute_tool", {"name": third, "arguments": {"value": "x"}})
            assert not ok.get("isError"), ok
        d.wait_for(lambda: _events(d) == 1, 30, "one usage event")
        status = d.status()["learning"]
        assert status["tools_with_feedback"] == 1 and status["updated_at"]
        assert _cli(d, "show", "notes__get_note")["events"] == 0
        shown = _cli(d, "show", third)
        assert shown["events"] == 1 and shown["queries"][0]["query"] == QUERY
    store = home[0] / "state" / "learning.sqlite3"
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o600
    with _daemon(home) as d:
        d.wait_for(lambda: _events(d) == 1, 30, "the event after a restart")
        after = d.search(QUERY)
        assert after.index(third) < 2, (before, after)
        # the other principal (an HTTP token) still sees the zero-shot ranking
        assert _other_search(d.http_url, QUERY) == before  # type: ignore[attr-defined]


def test_one_principals_flood_leaves_another_unchanged_and_reset_restores(home: tuple[Path, int]) -> None:
    with _daemon(home) as d:
        url = d.http_url  # type: ignore[attr-defined]
        query = "generated tool that returns its input"
        other_before = _other_search(url, query)
        wrong = other_before[-1]
        start = _events(d)
        with d.client() as c:
            for _ in range(500):
                c.call_tool("tool_search", {"query": query})
                assert not c.call_tool("execute_tool", {"name": wrong, "arguments": {}}).get("isError")
        d.wait_for(lambda: _events(d) == start + 500, 60, "500 more events")
        assert d.search(query)[0] == wrong  # the flooder's own ranking learned it
        assert _other_search(url, query) == other_before  # nobody else's did
        assert _cli(d, "show", wrong)["queries"][0]["count"] == 500
        assert _cli(d, "reset")["reset"] == start + 500
        d.wait_for(lambda: _events(d) == 0, 30, "the daemon to notice the reset")
        assert d.search(query) == other_before  # zero-shot again


def test_a_removed_tool_leaves_no_trace(home: tuple[Path, int]) -> None:
    with _daemon(home) as d:
        assert not d.tool("t__add_tool", {"name": "frob_widget", "description": "Frobnicate the widget gently."}).get("isError")
        d.wait_for(lambda: "t__frob_widget" in d.search("frobnicate the widget"), 30, "the new tool indexed")
        start = _events(d)
        with d.client() as c:
            for _ in range(3):
                c.call_tool("tool_search", {"query": "frobnicate the widget"})
                assert not c.call_tool("execute_tool", {"name": "t__frob_widget", "arguments": {}}).get("isError")
        # all three stored (they reach the store in batches: the first alone may show first)
        d.wait_for(lambda: _events(d) == start + 3, 30, "three events on the new tool")
        assert d.status()["learning"]["tools_with_feedback"] == 1
        assert not d.tool("t__remove_tool", {"name": "frob_widget"}).get("isError")
        d.wait_for(lambda: "t__frob_widget" not in d.search("frobnicate the widget", 20), 30, "the tool gone")
        for query in ("frobnicate the widget", "widget", QUERY):
            assert "t__frob_widget" not in d.search(query, 20)
        forgotten = _cli(d, "forget", "t__frob_widget")
        assert forgotten == {"tool": "t__frob_widget", "forgotten": 3}
        d.wait_for(lambda: _events(d) == 0, 30, "the daemon to notice the forget")


def test_without_top_k_the_answer_is_adaptive_and_says_when_nothing_fits(tmp_path: Path) -> None:
    examples = "".join(stdio_example(n) for n in ("notes", "weather", "units"))
    with Daemon(tmp_path, examples, search_extra='embedder = "onnx"\n') as d:
        d.wait_for(lambda: d.status()["index"]["degraded"] is None and d.status()["index"]["tools"] == 13, 120,
                   "hybrid search over the examples")
        found = d.meta("tool_search", {"query": "add a note"})
        assert 1 <= len(found["matches"]) <= 5 and found["matches"][0]["name"] == "notes__add_note"
        assert "note" not in found
        assert len(d.meta("tool_search", {"query": "add a note", "top_k": 5})["matches"]) == 5
        none = d.meta("tool_search", {"query": "book a flight to Rome"})
        assert none["matches"] == [] and "notes, units, weather" in none["note"], none
        # asked for a number, the caller gets the closest tools anyway
        assert len(d.meta("tool_search", {"query": "book a flight to Rome", "top_k": 3})["matches"]) == 3


def _learn_once(d: Daemon) -> None:
    """A search and a successful execute of its first result, on one connection."""
    with d.client() as c:
        found = [m["name"] for m in c.call_tool("tool_search", {"query": QUERY})["structuredContent"]["matches"]]
        assert found and all(n.startswith("t__") for n in found), found
        assert not c.call_tool("execute_tool", {"name": found[0], "arguments": {"value": "x"}}).get("isError")


def test_an_unusable_usage_store_never_stops_the_daemon(tmp_path: Path) -> None:
    """A usage store that is not a database is moved aside and learning starts again from no
    events; one that cannot be opened at all is retried while searches rank zero-shot, and
    learning resumes once it opens."""
    state = tmp_path / "state"
    state.mkdir()
    store = state / "learning.sqlite3"
    store.write_bytes(b"this is not an SQLite database. " * 256)
    cfg = stdio_testserver("t", "--tools", str(N_GEN))
    with Daemon(tmp_path, cfg) as d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstreams ready")
        # the store opens in the background: wait for the move and the new store
        d.wait_for(lambda: list(state.glob("learning.sqlite3.corrupt-*")) and store.exists()
                   and "error" not in d.status()["learning"], 30, "the unreadable store moved aside, a new one open")
        aside = list(state.glob("learning.sqlite3.corrupt-*"))
        assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not an SQLite database."), aside
        assert "is unreadable" in d.log.read_text() and "SQLITE_NOTADB" in d.log.read_text()
        _learn_once(d)
        d.wait_for(lambda: _events(d) == 1, 30, "one usage event in the new store")
        assert d.stop() == 0
    for side in state.glob("learning.sqlite3*"):
        side.unlink()
    store.mkdir()  # nothing can open this as a file
    with Daemon(tmp_path, cfg) as d:
        d.wait_for(lambda: "error" in d.status()["learning"], 30, "the failed open reported")
        error = d.status()["learning"]["error"]
        assert "learning.sqlite3" in error and "trying again in" in error, error
        assert d.search(QUERY)  # searches go on, zero-shot
        store.rmdir()
        d.wait_for(lambda: "error" not in d.status()["learning"], 60, "the store opened on a retry")
        _learn_once(d)
        d.wait_for(lambda: _events(d) == 1, 30, "a usage event once the store opened")
        assert d.stop() == 0


def test_an_outsized_query_is_not_learned_from(tmp_path: Path) -> None:
    """A query over MAX_QUERY_CHARS followed by a call of its result records no usage event:
    its text would otherwise be kept in memory (learning's recent searches, per connection)
    and in learning.sqlite3 (every event), at up to max_message_bytes a query."""
    from toolatlas.gateway.learning import MAX_QUERY_CHARS

    long_query = "echo a message back " * (MAX_QUERY_CHARS // 20 + 1)
    with Daemon(tmp_path, stdio_testserver("t")) as d:
        with d.client() as c:
            for query in (long_query, "echo a message back"):
                found = [m["name"] for m in c.call_tool("tool_search", {"query": query})["structuredContent"]["matches"]]
                assert found[0] == "t__echo", found
                assert not c.call_tool("execute_tool", {"name": "t__echo", "arguments": {"message": "x"}}).get("isError")
        # events are stored in order: once the second search's is there, the first's would be
        shown = d.wait_for(lambda: (s := _cli(d, "show", "t__echo"))["events"] >= 1 and s, 30, "the short query's event")
        assert shown["events"] == 1 and [q["query"] for q in shown["queries"]] == ["echo a message back"], shown
        assert _events(d) == 1


def test_an_event_past_retention_stops_counting_before_the_hourly_prune(tmp_path: Path) -> None:
    """`retention_days` is a promise about age: an event older than it no longer lifts its
    tool, counts in catalog_status or shows in `learning show`, without waiting for the
    hourly prune (here a retention of about 8.6 s)."""
    cfg = stdio_testserver("t", "--tools", str(N_GEN)) + "[learning]\nretention_days = 0.0001\n"
    with Daemon(tmp_path, cfg) as d:
        before = d.search(QUERY)
        with d.client() as c:
            c.call_tool("tool_search", {"query": QUERY})
            assert not c.call_tool("execute_tool", {"name": before[2], "arguments": {"value": "x"}}).get("isError")
        d.wait_for(lambda: _events(d) == 1, 30, "one usage event")
        assert d.search(QUERY)[0] == before[2]
        d.wait_for(lambda: _events(d) == 0, 60, "the event to expire")
        assert d.search(QUERY) == before
        assert _cli(d, "show", before[2])["events"] == 0


NARROW = "s3cret-narrow-token"


def test_catalog_status_counts_only_the_feedback_on_tools_the_caller_may_use(tmp_path: Path) -> None:
    """A caller whose rules give it only `notes` reads no figure of the feedback others gave
    tools of `t` (a server it may not use): no events, no tools with feedback, no time."""
    port = free_port()
    narrow = (f'[[http.tokens]]\nname = "narrow"\nsha256 = "{hash_token(NARROW)}"\n'
              '[[access]]\ntokens = ["narrow"]\nservers = ["notes"]\n')
    with Daemon(tmp_path, _config(port).replace("[[access]]", narrow + "[[access]]", 1)) as d:
        _learn_once(d)
        d.wait_for(lambda: _events(d) == 1, 30, "one usage event")
        assert d.status()["learning"]["tools_with_feedback"] == 1

        async def narrow_status() -> dict[str, Any]:
            with anyio.fail_after(60):
                async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {NARROW}"}, timeout=30) as http:
                    async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as c:
                        res = await c.call_tool("catalog_status", {})
                        status: dict[str, Any] = json.loads(res.content[0].text)
                        return status

        status = anyio.run(narrow_status)
        assert [s["name"] for s in status["servers"]] == ["notes"], status["servers"]
        assert status["learning"] == {"enabled": True, "events": 0, "tools_with_feedback": 0, "updated_at": None}


def test_a_stateless_http_client_records_feedback(tmp_path: Path) -> None:
    """A 2026-07-28 client over HTTP sends each request as its own exchange, with no session
    to tie them: its search and the call it led to (the same principal and client, on the
    same endpoint) are a usage event all the same; a direct call without a search is not."""
    port = free_port()
    with Daemon(tmp_path, _config(port)) as d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstreams ready")

        async def search_then_call() -> tuple[str, str]:
            with anyio.fail_after(60):
                async with _other(f"http://127.0.0.1:{port}/mcp") as c:
                    assert c.protocol_version == "2026-07-28"  # stateless: no session id
                    assert not (await c.call_tool("t__gen_000", {"value": "direct"})).is_error
                    res = await c.call_tool("tool_search", {"query": QUERY, "top_k": 5})
                    third = json.loads(res.content[0].text)["matches"][2]["name"]
                    assert not (await c.call_tool("execute_tool", {"name": third, "arguments": {"value": "x"}})).is_error
                    return third, "t__gen_000"

        third, direct = anyio.run(search_then_call)
        d.wait_for(lambda: _events(d) == 1, 30, "one usage event from the HTTP client")
        assert d.status()["learning"]["tools_with_feedback"] == 1
        assert _cli(d, "show", third)["queries"][0]["query"] == QUERY
        if direct != third:
            assert _cli(d, "show", direct)["events"] == 0


def test_a_query_that_led_to_a_tool_is_not_answered_nothing_fits(tmp_path: Path) -> None:
    """Without top_k, a query far from every description gets "nothing fits"; once its very
    words led the caller to a tool (a search with top_k, then a successful call), the same
    query without top_k returns that tool instead of saying none fits. Another principal's
    answer stays the abstention: one user's words count for no one else."""
    port = free_port()
    examples = "".join(stdio_example(n) for n in ("notes", "weather", "units"))
    cfg = (f'[http]\nlisten = "127.0.0.1:{port}"\n[[http.tokens]]\nname = "other"\nsha256 = "{hash_token(TOKEN)}"\n'
           '[[access]]\ntokens = ["other"]\nservers = ["*"]\n' + examples)
    jargon = "zorgle blatz quux"
    with Daemon(tmp_path, cfg, search_extra='embedder = "onnx"\n') as d:
        d.wait_for(lambda: d.status()["index"]["degraded"] is None and d.status()["index"]["tools"] == 13, 120,
                   "hybrid search over the examples")
        assert d.meta("tool_search", {"query": jargon})["matches"] == []
        with d.client() as c:
            c.call_tool("tool_search", {"query": jargon, "top_k": 20})
            assert not c.call_tool("execute_tool", {"name": "notes__list_notes", "arguments": {}}).get("isError")
        d.wait_for(lambda: _events(d) == 1, 30, "one usage event")
        found = d.meta("tool_search", {"query": jargon})
        assert [m["name"] for m in found["matches"]][:1] == ["notes__list_notes"], found
        assert "note" not in found

        async def other() -> dict[str, Any]:
            with anyio.fail_after(60):
                async with _other(f"http://127.0.0.1:{port}/mcp") as c:
                    res = await c.call_tool("tool_search", {"query": jargon})
                    answer: dict[str, Any] = json.loads(res.content[0].text)
                    return answer

        assert anyio.run(other)["matches"] == []
