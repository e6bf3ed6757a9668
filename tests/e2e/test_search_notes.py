"""What a model reads when tool_search has nothing to show, through a real daemon: an empty
`matches` always comes with a `note` saying why and what to do next (no tool matched; the
servers it named are down; the index is not ready), never a bare `[]`; and a meta-tool key it has no parameter for is named, not ignored."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, stdio_testserver, url_upstream
from tests.support.ports import free_port


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """`alpha` (the test server) and `down` (an HTTP upstream nothing listens for); BM25 only."""
    tmp = tmp_path_factory.mktemp("notes")
    down = url_upstream("down", "http", f"http://127.0.0.1:{free_port()}/mcp")
    with Daemon(tmp, stdio_testserver("alpha") + down) as d:
        d.wait_for(lambda: {s["name"]: s["state"] for s in d.status()["servers"]}["down"] == "degraded", 30,
                   "the down upstream degraded")
        yield d


def _search(d: Daemon, **args: Any) -> dict[str, Any]:
    return d.meta("tool_search", args)


@pytest.mark.parametrize("top_k", [None, 3])
def test_a_query_no_tool_matches_gets_a_note(gateway: Daemon, top_k: int | None) -> None:
    args: dict[str, Any] = {"query": "quantum chromodynamics lattice"}
    if top_k is not None:
        args["top_k"] = top_k
    answer = _search(gateway, **args)
    assert answer["matches"] == [] and answer["degraded"] is None
    note = answer["note"]
    assert "No tool matched" in note and "Searchable servers: alpha." in note and "Rephrase" in note
    assert "Not searched: upstream 'down'" in note  # the server that might have had it is down


EMPTY_SERVER = "from mcp.server.mcpserver import MCPServer; MCPServer('empty').run('stdio')"


@pytest.mark.timeout(90)
def test_a_server_that_lists_no_tools_is_said_so_not_rephrase(tmp_path: Path) -> None:
    """An upstream that lists no tools (now: one that lists them after a login, or relists
    [] for a moment) got "No tool matched this query ... Rephrase the query": a model then
    rephrased in vain. The note says the server lists no tools."""
    empty = (f'[[upstream]]\nname = "empty"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
             f'args = ["-c", "{EMPTY_SERVER}"]\n')
    with Daemon(tmp_path, empty + stdio_testserver("alpha")) as d:
        d.wait_for(lambda: {s["name"]: s["state"] for s in d.status()["servers"]}.get("empty") == "ready", 30,
                   "the empty upstream ready")
        only = _search(d, query="echo a message", servers=["empty"])
        assert only["matches"] == [] and only["note"].startswith("No tool to search: empty list(s) no tools now."), only
        assert "Rephrase" not in only["note"]
        both = _search(d, query="quantum chromodynamics lattice")
        assert both["matches"] == [] and "Searchable servers: alpha, empty (empty list(s) no tools now)." in both["note"]


def test_naming_a_server_that_is_down_says_so(gateway: Daemon) -> None:
    answer = _search(gateway, query="echo a message", servers=["down"])
    assert answer["matches"] == []
    assert answer["note"].startswith("Not searched: upstream 'down' has not connected yet (connect failed")
    both = _search(gateway, query="echo a message", servers=["alpha", "down"])
    assert [m["name"] for m in both["matches"]][:1] == ["alpha__echo"]
    assert both["note"].startswith("Not searched: upstream 'down'")
    compact = gateway.tool("tool_search", {"query": "echo a message", "servers": ["down"], "format": "compact"})
    assert "note: Not searched: upstream 'down'" in compact["content"][0]["text"]


def test_an_answer_with_matches_from_every_server_named_has_no_note(gateway: Daemon) -> None:
    assert "note" not in _search(gateway, query="echo a message")
    assert "note" not in _search(gateway, query="echo a message", servers=["alpha"])


def test_an_empty_servers_list_is_an_error_not_an_empty_answer(gateway: Daemon) -> None:
    """`servers: []` narrowed the search to nothing and answered a bare empty list (a model
    filling an optional array with [] meant no filter)."""
    result = gateway.tool("tool_search", {"query": "echo a message", "servers": []})
    text = result["content"][0]["text"]
    assert result["isError"] and "`servers` is an empty list" in text and "alpha, down" in text


def test_arguments_beside_name_are_refused_on_the_socket_relay(gateway: Daemon) -> None:
    """The socket's raw relay takes execute_tool before the SDK handler (from a connection's
    second request on, once the SDK has seen its protocol version): it refuses the same keys."""
    with gateway.client() as c:
        assert c.call_tool("execute_tool", {"name": "alpha__echo", "arguments": {"message": "hi"}})["content"][0]["text"] == "Echo: hi"
        flat = c.call_tool("execute_tool", {"name": "alpha__echo", "message": "hi"})
    assert flat["isError"] and flat["content"][0]["text"].startswith('execute_tool has no parameter "message"')


def test_unknown_server_names_are_quoted_short_whatever_was_sent(gateway: Daemon) -> None:
    """A 1 MB server name was echoed whole in the error (a reply that grows with the request)."""
    for servers in (["x" * 1_000_000], [f"s{i}" for i in range(100_000)]):
        result = gateway.tool("tool_search", {"query": "echo", "servers": servers})
        text = result["content"][0]["text"]
        assert result["isError"] and text.startswith("unknown server(s) ") and len(text) < 1000, text[:300]
        assert text.endswith("; servers you can search: alpha, down")
    many = gateway.tool("tool_search", {"query": "echo", "servers": [f"s{i}" for i in range(100_000)]})
    assert "s0, s1, " in many["content"][0]["text"] and "(+99990 more)" in many["content"][0]["text"]


def test_a_huge_query_is_not_echoed_whole(gateway: Daemon) -> None:
    """A 1 MB query came back twice (the text block and structuredContent): a 2 MB answer that
    grows with the request. The answer echoes its start and says how long it was."""
    query = "echo back a message " * 50_000
    result = gateway.tool("tool_search", {"query": query, "top_k": 3})
    assert not result.get("isError"), str(result)[:300]
    echoed = result["structuredContent"]["query"]
    assert echoed.startswith(query[:1000]) and echoed.endswith(f"... ({len(query)} characters)"), echoed[-100:]
    assert len(result["content"][0]["text"]) < 20_000
    assert _search(gateway, query="echo back a message", top_k=3)["query"] == "echo back a message"
