"""The approval lifecycle (issue 20 item 4) on a real daemon with `[daemon] require_approval`:
new upstreams connect and list but serve nothing until approved; reject keeps one off; the
decisions survive a restart and a reload; a changed command sends an approved upstream back
to pending; states show in catalog_status, `upstream list`, events and metrics."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx2

from tests.support.daemon import Daemon, stdio_faultserver, stdio_testserver
from tests.support.ports import free_port


def _approvals(d: Daemon) -> dict[str, str]:
    return {s["name"]: s["approval"] for s in d.status()["servers"]}


def _events(d: Daemon, name: str) -> list[dict[str, Any]]:
    out = []
    for line in d.log.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"event":"{name}"' in line:
            out.append(json.loads(line))
    return out


def _cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolatlas", "upstream", *args, "--socket", d.socket],
                          capture_output=True, text=True, timeout=60)


def test_approve_reject_across_restart_and_reload(tmp_path: Path) -> None:
    port = free_port()
    audit = tmp_path / "audit.jsonl"
    ups = f'[events]\naudit_file = "{audit}"\n' + stdio_testserver("one") + stdio_testserver("two")
    d = Daemon(tmp_path, ups, daemon_extra=f'require_approval = true\nmetrics_addr = "127.0.0.1:{port}"\n')
    with d:
        d.wait_for(lambda: all(s["state"] == "ready" and s["tools"] for s in d.status()["servers"]), 60, "listed")
        assert _approvals(d) == {"one": "pending", "two": "pending"}
        st = {s["name"]: s for s in d.status()["servers"]}
        assert st["one"]["searchable"] is False and "toolatlas upstream approve one" in st["one"]["not_searchable_because"]
        assert d.search("echo a message back") == []
        scoped = d.tool("tool_search", {"query": "echo", "servers": ["one"]})
        assert scoped["isError"] and "server 'one' serves nothing now (awaiting approval" in scoped["content"][0]["text"]
        refused = d.tool("execute_tool", {"name": "one__echo", "arguments": {"message": "x"}})
        # the caller's rules give it `one` (catalog_status shows it): it is told why, and no
        # access denial is recorded against it for the operator's hold
        assert refused["isError"] and "toolatlas upstream approve one" in refused["content"][0]["text"], refused
        listing = _cli(d, "list")
        assert listing.returncode == 0 and "pending" in listing.stdout, listing

        done = _cli(d, "approve", "one")
        assert done.returncode == 0 and "one: approved (was pending)" in done.stdout, done
        assert _cli(d, "reject", "two").returncode == 0
        assert _approvals(d) == {"one": "active", "two": "rejected"}
        assert "one__echo" in d.search("echo a message back")
        assert d.tool("execute_tool", {"name": "one__echo", "arguments": {"message": "hi"}})["content"][0]["text"] == "Echo: hi"
        rejected = d.tool("execute_tool", {"name": "two__echo", "arguments": {"message": "x"}})
        assert rejected["isError"] and "rejected by the operator" in rejected["content"][0]["text"], rejected
        assert _events(d, "access_denied") == []
        unknown = _cli(d, "approve", "nope")
        assert unknown.returncode == 64 and "one, two" in unknown.stderr, unknown
        metrics = httpx2.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'toolatlas_upstream_approval{state="active",upstream="one"} 1.0' in metrics
        assert 'toolatlas_upstream_approval{state="rejected",upstream="two"} 1.0' in metrics
        assert 'toolatlas_upstream_approval_transitions_total{state="approved"} 1.0' in metrics
    state_file = tmp_path / "state" / "approvals.json"
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
    me = _events(d, "admin_command_completed")
    assert {(e["command"], e["upstream"], e["outcome"]) for e in me} >= {
        ("upstream_approve", "one", "ok"), ("upstream_reject", "two", "ok"), ("upstream_approve", "nope", "bad_input")}

    # a restart keeps both decisions
    d2 = Daemon(tmp_path, ups, daemon_extra='require_approval = true\n')
    with d2:
        d2.wait_for(lambda: _approvals(d2) == {"one": "active", "two": "rejected"}, 60, "decisions kept")
        d2.wait_for(lambda: "one__echo" in d2.search("echo a message back"), 30, "one's tools in search")
        # a reload: one's command line changes (back to pending), three is new (pending), two stays rejected
        d2.config.write_text(d2.config.read_text().replace(stdio_testserver("one"), stdio_testserver("one", "--tools", "1"))
                             + stdio_testserver("three"))
        with d2.client() as c:
            applied = c.request("toolatlas/reload", {})
        assert applied["applied"] and applied["changed"] == ["one"] and applied["added"] == ["three"], applied
        d2.wait_for(lambda: _approvals(d2) == {"one": "pending", "two": "rejected", "three": "pending"}, 60, "reload")
        assert d2.search("echo a message back") == []
        assert _cli(d2, "approve", "three").returncode == 0
        d2.wait_for(lambda: any(s["name"] == "three" and s["approval"] == "active" and s["searchable"]
                                for s in d2.status()["servers"]), 30, "three active")
        assert "three__echo" in d2.search("echo a message back")
    moves = [(e["upstream"], e["old"], e["new"], e["by"]) for e in _events(d2, "upstream_approval_changed")]
    assert ("one", "approved", "pending", "daemon") in moves and ("three", None, "pending", "daemon") in moves
    assert any(m[0] == "three" and m[2] == "approved" and m[3].startswith("uid:") for m in moves), moves
    # approval changes reach the audit file of the first run
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    assert {(e["upstream"], e["new"]) for e in lines if e["event"] == "upstream_approval_changed"} >= {
        ("one", "pending"), ("one", "approved"), ("two", "rejected")}


def test_a_model_is_told_a_server_awaits_approval_not_that_it_is_unknown(tmp_path: Path) -> None:
    """catalog_status shows a pending upstream to its callers with the command that approves
    it; tool_search and execute_tool called it an unknown server or tool (with a "Did you mean"
    on other servers), and an unscoped search answered a bare empty list."""
    d = Daemon(tmp_path, stdio_testserver("one") + stdio_testserver("two"), daemon_extra="require_approval = true\n")
    with d:
        d.wait_for(lambda: all(s["state"] == "ready" and s["tools"] for s in d.status()["servers"]), 60, "listed")
        waits = "upstream 'one' serves nothing now (awaiting approval: `toolatlas upstream approve one`)"
        found = d.meta("tool_search", {"query": "echo a message back"})
        # as a scoped search says it, and a rejected one as rejected (not "until approved")
        assert found["matches"] == [] and found["note"] == (
            "Not searched: server 'one' serves nothing now (awaiting approval: `toolatlas upstream approve one`) | "
            "server 'two' serves nothing now (awaiting approval: `toolatlas upstream approve two`)."), found
        assert _cli(d, "approve", "two").returncode == 0
        scoped = d.tool("tool_search", {"query": "echo a message back", "servers": ["one"]})
        assert scoped["isError"] and scoped["content"][0]["text"] == (
            "server 'one' serves nothing now (awaiting approval: `toolatlas upstream approve one`); servers you can search: two")
        called = d.tool("execute_tool", {"name": "one__echo", "arguments": {"message": "x"}})
        assert called["isError"] and called["content"][0]["text"] == f"tool 'one__echo' cannot be called: {waits}"
        assert d.search("echo a message back")[:1] == ["two__echo"]


def test_only_an_admin_principal_approves(tmp_path: Path) -> None:
    import os
    import pwd
    import shutil
    import tempfile

    import pytest

    from tests.support.peers import run_as
    from toolatlas.surface.rawclient import RawClient, RpcError

    if os.geteuid() != 0:
        pytest.skip("a peer of another uid needs root to drop to it")
    base = Path(tempfile.mkdtemp(prefix="toolatlas-approve-"))
    os.chmod(base, 0o755)
    d = Daemon(base, stdio_testserver("one"), daemon_extra='require_approval = true\nsocket_mode = "0666"\n')
    (base / "run").mkdir(parents=True, exist_ok=True)
    os.chmod(base / "run", 0o755)
    try:
        with d:
            def attempt() -> Any:
                with RawClient(d.socket, timeout=30) as c:
                    try:
                        return c.request("toolatlas/upstream/approve", {"name": "one"})
                    except RpcError as exc:
                        return [exc.code, str(exc)]

            code, message = run_as(pwd.getpwnam("nobody"), attempt)
            assert code == -32003 and "owner only" in message
            assert _approvals(d) == {"one": "pending"}
            refused = _events(d, "admin_command_refused")
            assert [(e["command"], e["principal"]) for e in refused] == [("upstream_approve", "uid:65534")]
            assert _cli(d, "approve", "one").returncode == 0  # the owner (root here) may
            assert _approvals(d)["one"] in ("active", "degraded")
    finally:
        shutil.rmtree(base, ignore_errors=True)


FS = stdio_faultserver("fs")


def _approved_call_in_flight(d: Daemon) -> tuple[threading.Thread, list[dict[str, Any]]]:
    """Approve fs, start fs__work(90) in a thread, and wait until it runs upstream: the
    thread and the list its answer lands in."""
    assert _cli(d, "approve", "fs").returncode == 0
    d.wait_for(lambda: _approvals(d) == {"fs": "active"}, 60, "fs active")
    answer: list[dict[str, Any]] = []
    caller = threading.Thread(target=lambda: answer.append(
        d.tool("execute_tool", {"name": "fs__work", "arguments": {"seconds": 90}})), daemon=True)
    caller.start()
    d.wait_for(lambda: d.meta("fs__stats", {})["inflight"] == 1, 30, "the call in flight upstream")
    return caller, answer


def test_a_reject_ends_the_calls_in_flight_on_that_upstream(tmp_path: Path) -> None:
    """`upstream reject` keeps an upstream off: a call already running on it ends at once,
    its caller told why, as a reload that withdraws access ends one (not after its 90 s)."""
    with Daemon(tmp_path, FS, daemon_extra="require_approval = true\n") as d:
        caller, answer = _approved_call_in_flight(d)
        assert _cli(d, "reject", "fs").returncode == 0
        caller.join(30)
        assert answer, "the call on the rejected upstream is still running"
        assert answer[0]["isError"] and "the operator rejected upstream 'fs'" in answer[0]["content"][0]["text"], answer
        assert _events(d, "access_denied") == []  # the operator's hold, not the caller's rules


def test_a_reload_that_sends_an_upstream_back_to_pending_ends_its_calls_as_a_restart(tmp_path: Path) -> None:
    """An approved upstream whose command line a reload changes goes back to pending and is
    restarted: its call in flight ends saying a reload closed it, not that access rules
    changed, and is no access denial."""
    d = Daemon(tmp_path, FS, daemon_extra="require_approval = true\n")
    with d:
        caller, answer = _approved_call_in_flight(d)
        d.config.write_text(d.config.read_text().replace(FS, stdio_faultserver("fs", "--delay", "1")))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        caller.join(60)
        assert answer and "config reload or a restart" in answer[0]["content"][0]["text"], answer
        assert _approvals(d) == {"fs": "pending"}
        assert _events(d, "access_denied") == []
