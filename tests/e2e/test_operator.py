"""Operator commands against a real daemon: `toolatlas upstream list|restart|relist` and
`toolatlas reload` through the real CLI over the socket, for the daemon's owner only."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.peers import run_as
from tests.support.ports import free_port
from tests.support.processes import pid_alive

from toolatlas import admin_cli
from toolatlas.events import EVENT_FIELDS
from toolatlas.surface.rawclient import RawClient, RpcError

SECRET = "s3cr3t-operator-token-42"
PORTS: dict[str, int] = {}  # the module daemon's metrics and HTTP ports
# A stdio upstream that prints its (secret) token to stderr and exits 3: always degraded.
BROKEN = (
    '[[upstream]]\nname = "broken"\ntransport = "stdio"\n'
    f'command = "{sys.executable}"\n'
    'args = ["-c", "import os, sys; sys.stderr.write(\'boom with \' + os.environ[\'TOKEN\'] + chr(10)); sys.exit(3)"]\n'
    'env = { TOKEN = "${TA_OPS_SECRET}" }\n'
)


def cli(d: Daemon, *argv: str) -> subprocess.CompletedProcess[str]:
    """The real `toolatlas` command line against `d` (a new interpreter, as an operator runs it)."""
    return subprocess.run([sys.executable, "-m", "toolatlas", *argv, "--socket", d.socket],
                          capture_output=True, text=True, timeout=300)


def listing(d: Daemon) -> dict[str, dict[str, Any]]:
    out = cli(d, "upstream", "list", "--json")
    assert out.returncode == 0, out.stderr
    return {u["name"]: u for u in json.loads(out.stdout)["upstreams"]}


def events(d: Daemon, name: str) -> list[dict[str, Any]]:
    found = []
    for line in d.log.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"event":"{name}"' in line.replace(" ", ""):
            found.append(json.loads(line))
    return found


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    # A folder other users can traverse, and a socket they can connect to: the refusal of a
    # peer of another uid must come from the daemon, not from file permissions.
    base = Path(tempfile.mkdtemp(prefix="toolatlas-ops-"))
    os.chmod(base, 0o755)
    PORTS.update(metrics=free_port(), http=free_port())
    d = Daemon(base, stdio_testserver("one") + "relist_interval = 0\n" + BROKEN
               + f'[http]\nlisten = "127.0.0.1:{PORTS["http"]}"\nanonymous = "dev"\n',
               daemon_extra=f'socket_mode = "0666"\nmetrics_addr = "127.0.0.1:{PORTS["metrics"]}"')
    (base / "run").mkdir(parents=True, exist_ok=True)
    os.chmod(base / "run", 0o755)
    try:
        with d.start(env={"TA_OPS_SECRET": SECRET}):
            d.wait_for(lambda: listing(d)["broken"]["last_error"], 30, "broken's first failure")
            yield d
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_list_shows_each_upstream_with_state_pid_and_redacted_last_error(daemon: Daemon) -> None:
    ups = listing(daemon)
    assert list(ups) == ["one", "broken"]
    one, broken = ups["one"], ups["broken"]
    assert one["state"] == "ready" and one["transport"] == "stdio" and one["tools"] >= 9
    assert one["pid"] == int(daemon.tool("one__pid", {})["content"][0]["text"])
    assert broken["state"] in ("degraded", "connecting") and broken["tools"] == 0
    assert "exited with code 3" in broken["last_error"] and "boom with [REDACTED]" in broken["last_error"]
    assert SECRET not in json.dumps(ups)
    human = cli(daemon, "upstream", "list")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].split()[:5] == ["NAME", "TRANSPORT", "STATE", "TOOLS", "PID"]
    row = next(line for line in lines if line.startswith("one "))
    assert "ready" in row and str(one["pid"]) in row
    row = next(line for line in lines if line.startswith("broken "))
    assert "exited with code 3" in row and SECRET not in human.stdout


def test_restart_starts_a_new_child_and_its_tools_keep_working(daemon: Daemon) -> None:
    old = int(daemon.tool("one__pid", {})["content"][0]["text"])
    out = cli(daemon, "upstream", "restart", "one")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("one: restarted; ready with") and f"(was {old})" in out.stdout
    # Right after the answer, calls reach the fresh process: a new pid, the old one gone.
    new = int(daemon.tool("one__pid", {})["content"][0]["text"])
    assert new != old and not pid_alive(old)
    assert daemon.tool("execute_tool", {"name": "one__echo", "arguments": {"message": "hi"}})["content"][0]["text"] \
        == "Echo: hi"
    assert listing(daemon)["one"]["pid"] == new
    assert "one__echo" in daemon.search("echo the message back")


def test_last_error_outlives_the_recovery_until_a_restart(daemon: Daemon) -> None:
    crashed = daemon.tool("one__crash", {"code": 7})
    assert crashed.get("isError"), crashed
    one = daemon.wait_for(lambda: (u := listing(daemon)["one"])["state"] == "ready" and u, 30, "one back")
    assert "exited with code 7" in one["last_error"] and one["last_error_at"] <= one["since"]
    assert one["reconnects"] >= 1
    assert cli(daemon, "upstream", "restart", "one").returncode == 0
    assert listing(daemon)["one"]["last_error"] is None  # a fresh session starts with a clean slate


def test_restart_that_does_not_come_back_says_why_and_exits_1(daemon: Daemon) -> None:
    out = cli(daemon, "upstream", "restart", "broken", "--json")
    assert out.returncode == 1, out.stdout
    result = json.loads(out.stdout)
    assert result["ok"] is False and result["upstream"]["state"] == "degraded"
    assert "exited with code 3" in result["error"] and SECRET not in out.stdout


def test_relist_reports_what_changed_in_a_silent_server(daemon: Daemon) -> None:
    added = daemon.tool("one__add_tool", {"name": "fresh", "description": "A tool that appeared quietly.",
                                         "announce": False})
    assert not added.get("isError"), added
    out = cli(daemon, "upstream", "relist", "one")
    assert out.returncode == 0, out.stderr
    assert "1 added, 0 removed, 0 changed" in out.stdout and "  + one__fresh" in out.stdout.splitlines()
    # The new tool is in the catalog at once: callable by name.
    assert daemon.tool("one__fresh", {"text": "x"})["content"][0]["text"] == "fresh: x"
    again = cli(daemon, "upstream", "relist", "one", "--json")
    assert json.loads(again.stdout) | {"tools": 0} == {"upstream": "one", "tools": 0, "added": [], "removed": [],
                                                        "changed": []}
    daemon.tool("one__remove_tool", {"name": "fresh", "announce": False})
    gone = cli(daemon, "upstream", "relist", "one")
    assert gone.returncode == 0 and "  - one__fresh" in gone.stdout.splitlines(), gone.stdout


def test_relist_of_an_upstream_without_a_session_says_how_to_reconnect(daemon: Daemon) -> None:
    out = cli(daemon, "upstream", "relist", "broken")
    assert out.returncode == 1
    assert "broken" in out.stderr and "toolatlas upstream restart broken" in out.stderr


def test_unknown_name_lists_the_configured_upstreams(daemon: Daemon) -> None:
    for action in ("restart", "relist"):
        out = cli(daemon, "upstream", action, "nosuch")
        assert out.returncode == 64, out
        assert "no upstream named 'nosuch'" in out.stderr and "one, broken" in out.stderr


def test_reload_applies_an_edited_config_and_refuses_a_broken_one(daemon: Daemon) -> None:
    original = daemon.config.read_text()
    try:
        daemon.config.write_text(original.replace("[search]\n", "[search]\nquery_threads = 3\n")
                                 + stdio_testserver("two"))
        out = cli(daemon, "reload")
        assert out.returncode == 0, out.stderr
        assert "upstreams added: two; removed: none; changed: none" in out.stdout
        assert "only after a restart: search.query_threads" in out.stdout
        # The reload answers once applied; the new upstream connects and lists in the background.
        daemon.wait_for(lambda: daemon.tool("two__echo", {"message": "x"})["content"][0]["text"] == "Echo: x",
                        30, "two serving")
        assert listing(daemon)["two"]["state"] == "ready"

        daemon.config.write_text(original.replace("[daemon]\n", "[daemon]\nbogus_key = 1\n"))
        bad = cli(daemon, "reload")
        assert bad.returncode == 78
        assert "reload refused" in bad.stderr and "'bogus_key'" in bad.stderr and "[daemon]" in bad.stderr
        moved = original.replace(f'listen = "127.0.0.1:{PORTS["http"]}"',
                                 f'listen = "127.0.0.1:{free_port()}"')
        daemon.config.write_text(moved)
        refused = json.loads(cli(daemon, "reload", "--json").stdout)
        assert refused["applied"] is False and "[http] listen" in refused["error"]
        # The daemon kept serving its running config: two is still there.
        assert listing(daemon)["two"]["state"] == "ready"
        assert daemon.tool("two__echo", {"message": "y"})["content"][0]["text"] == "Echo: y"
    finally:
        daemon.config.write_text(original)
        assert cli(daemon, "reload").returncode == 0
    assert "two" not in listing(daemon)


def test_a_peer_of_another_uid_is_refused(daemon: Daemon) -> None:
    if os.geteuid() != 0:
        pytest.skip("a peer of another uid needs root to drop to it")
    nobody = pwd.getpwnam("nobody")
    pid = listing(daemon)["one"]["pid"]

    def raw() -> Any:
        with RawClient(daemon.socket, timeout=30) as c:
            out = {}
            for method, params in (("toolatlas/upstream/list", {}), ("toolatlas/upstream/restart", {"name": "one"}),
                                   ("toolatlas/reload", {})):
                try:
                    c.request(method, params)
                    out[method] = None
                except RpcError as exc:
                    out[method] = [exc.code, str(exc)]
            # The same connection still gets its MCP answers.
            out["search"] = c.call_tool("tool_search", {"query": "echo"})["isError"]
            return out

    def command() -> Any:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = admin_cli.upstream_main(["restart", "one", "--socket", daemon.socket])
        return [code, err.getvalue()]

    answers = run_as(nobody, raw)
    for method in ("toolatlas/upstream/list", "toolatlas/upstream/restart", "toolatlas/reload"):
        code, message = answers[method]
        assert code == -32003, answers
        assert "for the daemon's owner only" in message and "uid 65534 (nobody)" in message
        assert "the daemon runs as uid 0 (root)" in message
    assert answers["search"] is False
    code, err = run_as(nobody, command)
    assert code == 77 and "refused" in err and "uid 65534" in err
    assert listing(daemon)["one"]["pid"] == pid  # nothing was restarted
    refused = events(daemon, "admin_command_refused")
    assert {e["command"] for e in refused} >= {"upstream_list", "upstream_restart", "reload"}
    assert all(e["principal"] == "uid:65534" for e in refused)


def test_operator_methods_are_not_served_over_http(daemon: Daemon) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "toolatlas/reload", "params": {}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORTS['http']}/mcp", data=body,
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/json, text/event-stream"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    answer = json.loads(info.value.read())
    assert info.value.code == 400 and answer["error"]["code"] == -32601
    assert "only on its Unix socket" in answer["error"]["message"]


def test_admin_events_and_metrics_are_the_documented_ones(daemon: Daemon) -> None:
    assert cli(daemon, "upstream", "list").returncode == 0
    assert cli(daemon, "upstream", "relist", "one").returncode == 0
    assert cli(daemon, "upstream", "restart", "nosuch").returncode == 64
    done = events(daemon, "admin_command_completed")
    for name in ("admin_command_completed", "admin_command_refused", "upstream_relisted"):
        for e in events(daemon, name):
            assert set(e) - {"ts", "event", "environment"} == EVENT_FIELDS[name] and e["environment"] == "default", e
    assert {"upstream_list", "upstream_relist", "upstream_restart"} <= {e["command"] for e in done}
    bad = next(e for e in done if e["command"] == "upstream_restart" and e["upstream"] == "nosuch")
    assert bad["outcome"] == "bad_input" and "no upstream named" in bad["message"]
    assert any(e["upstream"] == "one" for e in events(daemon, "upstream_relisted"))
    text = urllib.request.urlopen(f"http://127.0.0.1:{PORTS['metrics']}/metrics", timeout=30).read().decode()
    assert 'toolatlas_admin_commands_total{command="upstream_relist",outcome="ok"}' in text
    assert 'toolatlas_admin_commands_total{command="upstream_restart",outcome="bad_input"}' in text
