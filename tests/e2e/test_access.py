"""Per-user scopes from the socket peer: two real Unix users see different tool sets from
one daemon, and a denied user cannot call a tool by name."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.peers import run_as
from tests.support.ports import free_port
from tests.support.results import text as _text

USERS = ("ta-alice", "ta-bob", "ta-carol")


def _ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


@pytest.fixture(scope="module")
def users() -> dict[str, pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("creating Unix users needs root (CI and the dev machines run as root)")
    return {u: _ensure_user(u) for u in USERS}


def _as_user(user: pwd.struct_passwd, tool: str, args: dict, sock: str) -> dict:
    """One tools/call over the socket from a forked child running as `user`."""
    return _in_child(user, sock, lambda c: c.call_tool(tool, args))


def _in_child(user: pwd.struct_passwd, sock: str, fn: Callable[[Any], Any]) -> Any:
    """`fn(RawClient)` in a forked child running as `user`, its JSON result back."""
    from toolatlas.surface.rawclient import RawClient

    def call() -> Any:
        with RawClient(sock, timeout=30) as c:
            return fn(c)

    return run_as(user, call)


def _search(user: pwd.struct_passwd, sock: str) -> list[str]:
    res = _as_user(user, "tool_search", {"query": "echo the message back", "top_k": 20}, sock)
    assert not res.get("isError"), res
    return [m["name"] for m in res["structuredContent"]["matches"]]


@pytest.mark.hostile
def test_two_users_see_different_tools_and_denied_calls_do_not_leak(users: dict[str, pwd.struct_passwd]) -> None:
    base = Path(tempfile.mkdtemp(prefix="toolatlas-access-"))
    os.chmod(base, 0o755)
    try:
        upstreams = stdio_testserver("alpha") + stdio_testserver("beta")
        port = free_port()
        d = Daemon(base, upstreams,
                   daemon_extra=f'socket_mode = "0666"\naccess_default = "deny"\nmetrics_addr = "127.0.0.1:{port}"')
        d.config.write_text(
            d.config.read_text()
            + '\n[[access]]\nusers = ["ta-alice"]\nservers = ["alpha"]\n'
            + '\n[[access]]\nusers = ["ta-bob"]\nservers = ["beta"]\n'
        )
        os.makedirs(base / "run", exist_ok=True)
        os.chmod(base / "run", 0o755)
        with d:
            alice, bob, carol = (users[u] for u in USERS)
            a, b = _search(alice, d.socket), _search(bob, d.socket)
            assert "alpha__echo" in a and not [n for n in a if not n.startswith("alpha__")]
            assert "beta__echo" in b and not [n for n in b if not n.startswith("beta__")]
            assert _search(carol, d.socket) == []  # no rule, default deny

            denied = _as_user(alice, "execute_tool", {"name": "beta__echo", "arguments": {"message": "x"}}, d.socket)
            missing = _as_user(alice, "execute_tool", {"name": "zeta__echo", "arguments": {}}, d.socket)
            direct = _as_user(alice, "beta__echo", {"message": "x"}, d.socket)
            assert denied["isError"] and missing["isError"] and direct["isError"]
            # The refusal reads the same whether or not the tool exists, and names nothing of beta.
            assert _text(denied).replace("beta__echo", "X") == _text(missing).replace("zeta__echo", "X")
            assert _text(direct) == _text(denied)
            assert "beta__" not in _text(denied).replace("beta__echo", "")
            ok = _as_user(alice, "execute_tool", {"name": "alpha__echo", "arguments": {"message": "x"}}, d.socket)
            assert _text(ok) == "Echo: x"

            status = _as_user(bob, "catalog_status", {}, d.socket)["structuredContent"]
            assert [s["name"] for s in status["servers"]] == ["beta"]
            # #15 item 6: every figure is bob's share (beta), not the whole catalog's.
            beta_tools = status["servers"][0]["tools"]
            assert status["index"]["tools"] == beta_tools and status["index"]["servers"] == 1, status["index"]
            assert status["tools"] == beta_tools
            assert set(status["cards"]["servers"]) <= {"beta"} and status["cards"]["refused_cards"] == []

            def bob_tokens() -> dict | None:
                t = _as_user(bob, "catalog_status", {}, d.socket)["structuredContent"]["tokens"]
                return t if "tools" in t else None

            tokens = d.wait_for(bob_tokens, 60, "bob's token figures")
            assert tokens["tools"] == beta_tools, tokens
            assert d.status()["index"]["tools"] == 0  # root: no rule, denied by default
            hello = _in_child(alice, d.socket, lambda c: c.initialize_result["instructions"])
            assert "alpha" in hello and "beta" not in hello, hello
            # The refused calls above are counted as upstream "unknown", never as beta.
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            beta_calls = [ln for ln in metrics.splitlines() if ln.startswith("toolatlas_calls_total") and "beta" in ln]
            assert beta_calls == [], beta_calls
            assert [ln for ln in metrics.splitlines() if ln.startswith("toolatlas_calls_total")
                    and 'upstream="unknown"' in ln and "bad_input" in ln], metrics
            # root (the daemon's own user here) matches no rule either: denied by default.
            assert d.search("echo the message back", 20) == []
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _ensure_group(name: str, members: tuple[str, ...] = ()) -> int:
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", name], check=True)
        gid = grp.getgrnam(name).gr_gid
    for member in members:
        subprocess.run(["usermod", "-a", "-G", name, member], check=True)
    return gid


@pytest.mark.hostile
def test_group_rules_match_the_groups_the_kernel_reports_for_the_peer(users: dict[str, pwd.struct_passwd]) -> None:
    """A `groups` rule matches the groups the peer process has (the kernel's SO_PEERGROUPS),
    as the socket's own permission check does: a process that dropped the group (a sandbox,
    `setpriv --clear-groups`) no longer gets its access though /etc/group lists its user, and
    one given the group (systemd SupplementaryGroups=) gets it though /etc/group does not."""
    alice, carol = users["ta-alice"], users["ta-carol"]
    devs = _ensure_group("ta-devs", members=("ta-alice",))
    base = Path(tempfile.mkdtemp(prefix="toolatlas-groups-"))
    os.chmod(base, 0o755)
    try:
        d = Daemon(base, stdio_testserver("alpha"), daemon_extra='socket_mode = "0666"\naccess_default = "deny"')
        d.config.write_text(d.config.read_text() + '\n[[access]]\ngroups = ["ta-devs"]\nservers = ["alpha"]\n')
        os.makedirs(base / "run", exist_ok=True)
        os.chmod(base / "run", 0o755)
        with d:
            def search() -> list[str]:
                from toolatlas.surface.rawclient import RawClient

                with RawClient(d.socket, timeout=30) as c:
                    res = c.call_tool("tool_search", {"query": "echo the message back", "top_k": 5})
                    return [m["name"] for m in res["structuredContent"]["matches"]]

            assert "alpha__echo" in run_as(alice, search, groups=[devs])  # in the group, as /etc/group says
            assert run_as(alice, search) == []  # its process dropped the group
            assert "alpha__echo" in run_as(carol, search, groups=[devs])  # given the group, not in /etc/group
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)



def test_a_scoped_callers_index_figures_count_only_its_servers_documents(tmp_path: Path) -> None:
    """With the embedding model, catalog_status's `index.model` (documents embedded of
    total) and the embedding counters counted every server's documents: a caller given only
    alpha read the size of the catalog it may not see (48 for alpha's 9 tools). Now its
    figures are its share, and counters it has no share of are null."""
    d = Daemon(tmp_path, stdio_testserver("alpha") + stdio_testserver("beta", "--tools", "30"),
               daemon_extra='access_default = "deny"', search_extra='embedder = "onnx"\n')
    d.config.write_text(d.config.read_text() + '\n[[access]]\nusers = ["root"]\nservers = ["alpha"]\n')
    with d:
        d.wait_for(lambda: d.status()["index"]["model"]["phase"] == "ready" and d.status()["index"]["degraded"] is None,
                   120, "hybrid search")
        index = d.status()["index"]
        alpha = index["tools"]
        assert alpha == next(s["tools"] for s in d.status()["servers"] if s["name"] == "alpha"), index
        assert index["model"]["embedded"] == index["model"]["total"] == alpha, index["model"]
        assert index["embeddings_computed"] is None and index["embeddings_cached"] is None, index


def test_a_scoped_caller_does_not_read_the_daemons_search_activity(tmp_path: Path) -> None:
    """catalog_status showed a caller given only alpha how many searches everyone made
    (`index.searches`, the result cache's hits and misses, `cache.fast_lane`): how busy the
    servers it may not use are. Those figures are null for it now."""
    d = Daemon(tmp_path, stdio_testserver("alpha") + stdio_testserver("beta"), daemon_extra='access_default = "deny"')
    d.config.write_text(d.config.read_text() + '\n[[access]]\nusers = ["root"]\nservers = ["alpha"]\n')
    with d:
        d.wait_for(lambda: d.status()["index"]["ready"], 60, "the index")
        for _ in range(3):
            d.search("echo a message")
        status = d.status()
        index = status["index"]
        assert index["searches"] is None and index["cache"] is None and index["lone_queries"] is None, index
        assert status["cache"] is None, status["cache"]
        assert index["tools"] == next(s["tools"] for s in status["servers"] if s["name"] == "alpha")
