"""The operator channel in process: `access.admin_refusal` (who may), `AdminLane` (dispatch,
errors, audit) with a fake port, and a real `UnixServer` that answers `toolatlas/*` requests
before the MCP server does (the real daemon: tests/e2e/test_operator.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.surface.test_surface import FakeGateway

from toolatlas.access import admin_refusal
from toolatlas.errors import BadInput, UpstreamUnavailable
from toolatlas.gateway.ports import Connection
from toolatlas.surface.admin import FORBIDDEN, METHODS, AdminLane
from toolatlas.surface.rawclient import RawClient, RpcError
from toolatlas.surface.server import Surface
from toolatlas.surface.unix import UnixServer

OWNER = 1000


class FakeAdmin:
    """An AdminPort with two upstreams; `reload_ok` says how a reload ends."""

    def __init__(self) -> None:
        self.audit: list[tuple[str, str | None, str, str | None]] = []
        self.done: list[str] = []
        self.reload_ok = True

    def _known(self, name: str) -> None:
        if name not in ("a", "b"):
            raise BadInput(f"no upstream named {name!r}; the configured upstreams are: a, b")

    def list_upstreams(self) -> list[dict[str, Any]]:
        return [{"name": "a", "state": "ready"}, {"name": "b", "state": "degraded"}]

    async def restart_upstream(self, name: str) -> dict[str, Any]:
        self._known(name)
        self.done.append(f"restart {name}")
        return {"upstream": {"name": name}, "ok": name == "a", "error": None if name == "a" else "exited"}

    async def relist_upstream(self, name: str) -> dict[str, Any]:
        self._known(name)
        if name == "b":
            raise UpstreamUnavailable("upstream 'b' is degraded")
        self.done.append(f"relist {name}")
        return {"upstream": name, "tools": 1, "added": [], "removed": [], "changed": []}

    async def reload_config(self) -> dict[str, Any]:
        self.done.append("reload")
        return {"applied": True} if self.reload_ok else {"applied": False, "error": "unknown key 'x' in [daemon]"}

    def audit_admin(self, conn: Connection, method: str, *, upstream: str | None, outcome: str,
                    message: str | None = None) -> None:
        self.audit.append((method, upstream, outcome, message))


def test_only_the_daemons_user_and_root_may() -> None:
    assert admin_refusal(OWNER, OWNER) is None
    assert admin_refusal(0, OWNER) is None
    why = admin_refusal(4242, OWNER)
    assert why is not None and "uid 4242" in why and f"uid {OWNER}" in why and "owner only" in why
    assert "SO_PEERCRED" in (admin_refusal(None, OWNER) or "")
    assert admin_refusal(os.getuid()) is None  # default owner: this process's user


async def test_lane_dispatches_reports_errors_and_audits_each_command() -> None:
    port = FakeAdmin()
    lane = AdminLane(port, daemon_uid=OWNER)
    me = Connection(id=1, uid=OWNER)
    with anyio.fail_after(10):
        listed = await lane(me, 1, "toolatlas/upstream/list", None)
        assert listed == {"jsonrpc": "2.0", "id": 1, "result": {"upstreams": port.list_upstreams()}}
        assert (await lane(me, 2, "toolatlas/upstream/restart", {"name": "a"}))["result"]["ok"] is True
        failed = await lane(me, 3, "toolatlas/upstream/restart", {"name": "b"})
        assert failed["result"]["ok"] is False  # ran, did not come back: a result, audited as failed
        unknown = await lane(me, 4, "toolatlas/upstream/relist", {"name": "zz"})
        assert unknown["error"]["code"] == -32602 and "a, b" in unknown["error"]["message"]
        down = await lane(me, 5, "toolatlas/upstream/relist", {"name": "b"})
        assert down["error"] == {"code": -32000, "message": "upstream 'b' is degraded"}
        no_name = await lane(me, 6, "toolatlas/upstream/restart", {"name": 7})
        assert no_name["error"]["code"] == -32602 and "`name`" in no_name["error"]["message"]
        port.reload_ok = False
        assert (await lane(me, 7, "toolatlas/reload", {}))["result"]["applied"] is False
        bogus = await lane(me, 8, "toolatlas/shutdown", {})
        assert bogus["error"]["code"] == -32601 and all(m in bogus["error"]["message"] for m in METHODS)
    assert [(m, o) for m, _, o, _ in port.audit] == [
        ("toolatlas/upstream/list", "ok"), ("toolatlas/upstream/restart", "ok"),
        ("toolatlas/upstream/restart", "failed"), ("toolatlas/upstream/relist", "bad_input"),
        ("toolatlas/upstream/relist", "failed"), ("toolatlas/upstream/restart", "bad_input"),
        ("toolatlas/reload", "failed"), ("toolatlas/shutdown", "bad_input"),
    ]
    assert port.audit[2][3] == "exited" and port.audit[6][3] == "unknown key 'x' in [daemon]"


async def test_lane_refuses_another_uid_before_doing_anything() -> None:
    port = FakeAdmin()
    lane = AdminLane(port, daemon_uid=OWNER)
    with anyio.fail_after(10):
        for method in (*METHODS, "toolatlas/anything"):
            answer = await lane(Connection(id=2, uid=4242, pid=77), 9, method, {"name": "a"})
            assert answer["error"]["code"] == FORBIDDEN and "uid 4242" in answer["error"]["message"]
    assert port.done == []
    assert {o for _, _, o, _ in port.audit} == {"refused"}


@pytest.mark.parametrize("with_admin", [True, False])
async def test_the_socket_answers_operator_methods_before_the_mcp_server(with_admin: bool, tmp_path: Path) -> None:
    port = FakeAdmin()
    path = str(tmp_path / "s.sock")
    server = UnixServer(Surface(FakeGateway()).server, path,
                        admin=AdminLane(port, daemon_uid=os.getuid()) if with_admin else None)

    def client() -> tuple[Any, bool]:
        with RawClient(path, timeout=10) as c:
            try:
                answer: Any = c.request("toolatlas/upstream/list", {})
            except RpcError as exc:
                answer = exc.code
            # MCP goes on as before on the same connection.
            return answer, c.call_tool("tool_search", {"query": "note"})["isError"]

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(server.run)
            answer, is_error = await anyio.to_thread.run_sync(client)
            tg.cancel_scope.cancel()
    assert is_error is False
    # Without the lane (the HTTP endpoint's case) the SDK does not know the method.
    assert answer == ({"upstreams": port.list_upstreams()} if with_admin else -32601)
