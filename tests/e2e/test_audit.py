"""The audit trail of a real daemon (issue 20 item 1): every tools/list, tool_search,
execute_tool, direct call, access denial and operator command writes an audit line with the
principal, client name and version, endpoint, connection id and request id, to stderr and to
`[events] audit_file` (mode 0600, rotated by size); query text only with log_queries."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.e2e.test_http_endpoint import _client
from tests.support.daemon import Daemon, stdio_testserver
from tests.support.ports import free_port
from tests.support.processes import descendants, kill_all
from toolatlas import __version__
from toolatlas.events import AUDIT_EVENTS, AUDIT_FIELDS, EVENT_FIELDS
from toolatlas.surface.http import hash_token

TOKEN = "ci-token-for-the-audit-test"
MAX_BYTES = 8192
KEEP = 50


def audit_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of the audit file and its rotated files, oldest first."""
    rotated = sorted(path.parent.glob(path.name + ".*"), key=lambda p: -int(p.suffix[1:]))
    out = []
    for p in [*rotated, path]:
        out += [json.loads(line) for line in p.read_text().splitlines()]
    return out


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path, str]]:
    tmp = tmp_path_factory.mktemp("audit")
    port = free_port()
    audit = tmp / "audit" / "audit.jsonl"
    cfg = (f'[events]\naudit_file = "{audit}"\naudit_max_bytes = {MAX_BYTES}\naudit_keep = {KEEP}\n'
           f'[http]\nlisten = "127.0.0.1:{port}"\n[[http.tokens]]\nname = "ci"\nsha256 = "{hash_token(TOKEN)}"\n'
           f'[[access]]\nusers = [{os.getuid()}]\nservers = ["one"]\n'
           '[[access]]\ntokens = ["ci"]\nservers = ["one"]\n'
           + stdio_testserver("one") + stdio_testserver("two"))
    d = Daemon(tmp, cfg, daemon_extra='access_default = "deny"\n')
    with d:
        yield d, audit, f"http://127.0.0.1:{port}/mcp"


def test_every_surface_and_denial_is_audited_with_rotation(audited: tuple[Daemon, Path, str]) -> None:
    d, audit, url = audited
    ids: dict[str, int] = {}
    with d.client() as c:
        c.request("tools/list", {})
        ids["list"] = c._id
        assert c.call_tool("tool_search", {"query": "echo a message back"})["structuredContent"]["matches"]
        ids["search"] = c._id
        assert c.call_tool("execute_tool", {"name": "one__echo", "arguments": {"message": "hi"}})["content"][0]["text"] == "Echo: hi"
        ids["execute"] = c._id
        assert c.call_tool("one__echo", {"message": "direct"})["content"][0]["text"] == "Echo: direct"
        ids["direct"] = c._id
        assert c.call_tool("execute_tool", {"name": "two__echo", "arguments": {"message": "x"}})["isError"]
        ids["denied_call"] = c._id
        assert c.call_tool("tool_search", {"query": "echo", "servers": ["two"]})["isError"]
        ids["denied_search"] = c._id
        refused = c.call_tool("execute_tool", {"name": "one__echo", "arguments": {"message": ["s3cr3t-value"]}})
        assert refused["isError"] and "s3cr3t-value" in refused["content"][0]["text"]  # the caller sees its value
        ids["failed"] = c._id
        assert c.request("toolatlas/upstream/list", {})["upstreams"]
        ids["admin"] = c._id
    # HTTP: a wrong token is denied; the right one lists and searches as token:ci
    r = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                    headers={"Authorization": "Bearer wrong", "Accept": "application/json, text/event-stream"})
    assert r.status_code == 401

    async def over_http() -> None:
        with anyio.fail_after(60):
            async with _client(url, TOKEN) as hc:
                await hc.list_tools()
                await hc.call_tool("tool_search", {"query": "echo"})

    anyio.run(over_http)
    # enough searches to rotate the file a few times
    with d.client() as c:
        for i in range(70):
            c.call_tool("tool_search", {"query": f"echo message number {i}"})
    d.wait_for(lambda: sum(1 for e in audit_lines(audit) if e["event"] == "tool_search_completed") >= 72, 30,
               "audit lines")

    assert stat.S_IMODE(audit.stat().st_mode) == 0o600
    rotated = list(audit.parent.glob("audit.jsonl.*"))
    assert len(rotated) >= 2, "the file was rotated"
    for p in rotated:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600 and p.stat().st_size <= MAX_BYTES
    lines = audit_lines(audit)
    for e in lines:  # only audit events, each with exactly its documented fields (no query)
        assert e["event"] in AUDIT_EVENTS, e
        assert set(e) - {"ts", "event", "environment"} == EVENT_FIELDS[e["event"]] - {"query"}, e
        assert AUDIT_FIELDS <= set(e)
        assert "echo message number" not in json.dumps(e)  # query text only with log_queries
    me = f"uid:{os.getuid()}"
    sock = [e for e in lines if e["principal"] == me and e["client"] == "toolatlas-cli"]
    for e in sock:
        assert e["client_version"] == __version__ and e["endpoint"] == "default"
        assert isinstance(e["connection"], int) and e["user"]

    listed = [e for e in sock if e["event"] == "tools_list_served"]
    assert len(listed) == 1 and listed[0]["request"] == ids["list"], listed
    first = listed[0]["connection"]

    def one(event: str, request: int, **match: Any) -> dict[str, Any]:
        found = [e for e in sock if e["event"] == event and e["request"] == request and e["connection"] == first
                 and all(e.get(k) == v for k, v in match.items())]
        assert len(found) == 1, (event, request, found)
        return found[0]

    one("tool_search_completed", ids["search"])
    one("execute_tool_completed", ids["execute"], name="one__echo", upstream="one", via="execute_tool", outcome="ok")
    one("execute_tool_completed", ids["direct"], name="one__echo", via="direct")
    denied = one("access_denied", ids["denied_call"], surface="execute_tool", target="two__echo")
    assert "two" in denied["reason"]
    one("execute_tool_failed", ids["denied_call"], outcome="bad_input")
    one("access_denied", ids["denied_search"], surface="tool_search", target="two")
    failed = one("execute_tool_failed", ids["failed"], name="one__echo", upstream="one", error_class="BadInput")
    assert "inputSchema" in failed["message"] and len(failed["message"]) <= 300
    # the trail names what failed, never an argument's value
    assert "at /message: fails type ('string')" in failed["message"] and "s3cr3t" not in json.dumps(failed), failed
    admin = one("admin_command_completed", ids["admin"], command="upstream_list", outcome="ok")
    assert admin["upstream"] is None
    http_denied = [e for e in lines if e["event"] == "access_denied" and e["surface"] == "http"]
    assert http_denied and http_denied[0]["principal"] == "unauthenticated"
    via_http = [e for e in lines if e["principal"] == "token:ci"]
    assert {e["event"] for e in via_http} >= {"tools_list_served", "tool_search_completed"}
    assert all(e["client"] == "mcp" and e["user"] is None and e["request"] is not None for e in via_http), via_http
    # the connection ids tell the two socket connections apart
    assert len({e["connection"] for e in sock if e["event"] == "tool_search_completed"}) == 2


def test_a_killed_daemon_loses_no_written_line_and_queries_need_log_queries(tmp_path: Path) -> None:
    import signal

    audit = tmp_path / "audit.jsonl"
    d = Daemon(tmp_path, f'[events]\naudit_file = "{audit}"\n' + stdio_testserver("one"),
               daemon_extra="log_queries = true\n")
    with d:
        with d.client() as c:
            # Each line is one write(2), made before its answer goes out (the audit is written
            # ahead; the bookkeeping of a daemon without one follows the answer): the line is in
            # the file when the answer arrives, and a daemon killed then loses none.
            for i in range(20):
                c.call_tool("tool_search", {"query": f"find tool {i}"})
                written = audit_lines(audit)[-1]
                assert (written["event"], written["request"]) == ("tool_search_completed", c._id)
            for i in range(5):
                assert not c.call_tool("execute_tool", {"name": "one__echo", "arguments": {"message": f"m{i}"}})["isError"]
                written = audit_lines(audit)[-1]
                assert (written["event"], written["request"]) == ("execute_tool_completed", c._id)
            last = c._id
        kids = descendants(d.proc.pid)  # type: ignore[union-attr]
        d.stop(signal.SIGKILL)
        kill_all(kids)
    lines = audit_lines(audit)
    searches = [e for e in lines if e["event"] == "tool_search_completed"]
    assert [e["query"] for e in searches] == [f"find tool {i}" for i in range(20)]
    calls = [e for e in lines if e["event"] == "execute_tool_completed"]
    assert len(calls) == 5 and calls[-1]["request"] == last


def test_a_caller_cannot_make_an_audit_line_of_its_own_size(tmp_path: Path) -> None:
    """What a caller sends is bounded in the audit lines as the message and target are: a
    megabyte tool name, a megabyte JSON-RPC id and a `servers` list repeating one name do not
    make megabyte lines (which would rotate the trail away in a few calls)."""
    audit = tmp_path / "audit" / "audit.jsonl"
    d = Daemon(tmp_path, f'[events]\naudit_file = "{audit}"\n' + stdio_testserver("one"))
    big = "x" * 1_000_000
    with d:
        with d.client() as c:
            refused = c.call_tool("execute_tool", {"name": f"one__{big}"})
            assert refused["isError"]
            c.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": big, "method": "tools/call", "params": {
                "name": "execute_tool", "arguments": {"name": "one__echo", "arguments": {"message": "m"}}}}).encode()
                + b"\n")
            assert len(c._next_line()) > len(big)  # answered, under its own id
            found = c.call_tool("tool_search", {"query": "echo", "servers": ["one"] * 100_000, "top_k": 1})
            assert not found["isError"], found

        def three() -> list[str] | None:  # the two calls' lines and the search's (written just after its answer)
            got = [ln for ln in audit.read_text().splitlines() if '"execute_tool_' in ln
                   or '"tool_search_completed"' in ln][-3:] if audit.exists() else []
            return got if len(got) == 3 and '"tool_search_completed"' in got[-1] else None

        lines = d.wait_for(three, 30, "the three audit lines")
        events = [json.loads(ln) for ln in lines]
        assert [e["event"] for e in events] == ["execute_tool_failed", "execute_tool_completed", "tool_search_completed"]
        assert max(len(ln) for ln in lines) < 4096, [len(ln) for ln in lines]
        assert events[0]["name"].startswith("one__xxx") and events[2]["scope"] == ["one"]


def test_resource_reads_and_prompt_gets_are_audited(tmp_path: Path) -> None:
    """Reading a resource or getting a prompt hands the caller an upstream's data as a tool
    call does: each is an audit line naming who read what from which upstream, and how it
    ended; one of a server the caller may not use names no upstream."""
    from toolatlas.surface.rawclient import RawClient, RpcError

    audit = tmp_path / "audit.jsonl"
    cfg = (f'[events]\naudit_file = "{audit}"\n[[access]]\nusers = [{os.getuid()}]\nservers = ["one"]\n'
           + stdio_testserver("one", "--name", "one", "--resources", "2")
           + stdio_testserver("two", "--name", "two", "--resources", "2"))
    with Daemon(tmp_path, cfg, daemon_extra='access_default = "deny"\n') as d:
        with RawClient(d.socket, timeout=30) as c:
            assert c.request("resources/read", {"uri": "test://res/001"})["contents"][0]["text"] == "resource 001"
            assert "greet" in json.dumps(c.request("prompts/get", {"name": "one__greet", "arguments": {"name": "x"}}))
            with pytest.raises(RpcError):
                c.request("prompts/get", {"name": "two__greet", "arguments": {"name": "x"}})
    lines = audit_lines(audit)
    reads = [e for e in lines if e["event"] == "resource_read_completed"]
    gets = [e for e in lines if e["event"] == "prompt_get_completed"]
    assert [(e["uri"], e["upstream"], e["outcome"]) for e in reads] == [("test://res/001", "one", "ok")], reads
    assert [(e["name"], e["upstream"], e["outcome"]) for e in gets] == [
        ("one__greet", "one", "ok"), ("two__greet", "unknown", "not_found")], gets
    for e in reads + gets:
        assert AUDIT_FIELDS <= set(e) and e["principal"] == f"uid:{os.getuid()}" and e["request"] is not None, e
