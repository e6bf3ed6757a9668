"""Per-user scopes from the socket peer: two real Unix users see different tool sets from
one daemon, and a denied user cannot call a tool by name."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, stdio_testserver
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
    """One tools/call over the socket from a forked child running as `user`.

    A fork, not a new interpreter: the project's venv may live where other users cannot read.
    """
    from toolatlas.surface.rawclient import RawClient

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            with RawClient(sock, timeout=30) as c:
                out = {"result": c.call_tool(tool, args)}
        except BaseException as exc:  # report, never return into pytest
            out = {"error": repr(exc)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    out = json.loads(data)
    assert "result" in out, out
    return out["result"]


def _search(user: pwd.struct_passwd, sock: str) -> list[str]:
    res = _as_user(user, "tool_search", {"query": "echo the message back", "top_k": 20}, sock)
    assert not res.get("isError"), res
    return [m["name"] for m in res["structuredContent"]["matches"]]


def test_two_users_see_different_tools_and_denied_calls_do_not_leak(users: dict[str, pwd.struct_passwd]) -> None:
    base = Path(tempfile.mkdtemp(prefix="toolatlas-access-"))
    os.chmod(base, 0o755)
    try:
        upstreams = stdio_testserver("alpha") + stdio_testserver("beta")
        d = Daemon(base, upstreams, daemon_extra='socket_mode = "0666"\naccess_default = "deny"')
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
            # root (the daemon's own user here) matches no rule either: denied by default.
            assert d.search("echo the message back", 20) == []
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
