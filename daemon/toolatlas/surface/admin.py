"""Operator commands on the Unix socket: `toolatlas/*` JSON-RPC methods, for the daemon's owner.

| method | params | result |
| --- | --- | --- |
| `toolatlas/upstream/list` | `{}` | `{"upstreams": [{name, transport, state, tools, pid, reason, last_error, ...}]}` |
| `toolatlas/upstream/restart` | `{"name"}` | `{"upstream": {...}, "ok", "previous_pid", "error"}` |
| `toolatlas/upstream/relist` | `{"name"}` | `{"upstream", "tools", "added", "removed", "changed"}` |
| `toolatlas/upstream/approve` | `{"name"}` | `{"upstream", "approval": "approved", "previous"}` |
| `toolatlas/upstream/reject` | `{"name"}` | `{"upstream", "approval": "rejected", "previous"}` |
| `toolatlas/reload` | `{}` | `{"applied": true, "added", "removed", "changed", "restart_needed"}` or `{"applied": false, "error"}` |
| `toolatlas/tools` | `{"servers"?: [..]}` | `{"tools": [definitions as tool_search matches show them, without score]}`: for any peer, of the servers it may use (what `toolatlas stubs` generates from) |

The socket's reader (surface.wire) hands these requests here before the MCP server sees the
line: they are no MCP tools, and the HTTP endpoint refuses them (surface.http). Only a peer
whose kernel-reported uid (SO_PEERCRED) is the daemon's own or root's may use them
(`access.admin_refusal`); anyone else gets error FORBIDDEN naming why. `toolatlas/tools` is
the exception: any peer may ask, and gets only what its access rules let it use (like
tools/list, it is not audited). Other errors:
-32601 an unknown `toolatlas/` method (the message lists them), -32602 bad params or an
unknown upstream (the message lists the configured ones), -32000 an upstream that cannot do
it now (not connected, too slow), -32603 a bug (logged). Every command is audited.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from toolatlas.access import admin_refusal
from toolatlas.errors import BadInput, ToolatlasError
from toolatlas.gateway.ports import REQUEST, AdminPort, Connection, Request
from toolatlas.meta_tools import servers_arg
from toolatlas.surface.rpccheck import INTERNAL_ERROR, INVALID_PARAMS

log = logging.getLogger(__name__)

ADMIN_PREFIX = "toolatlas/"
FORBIDDEN = -32003  # the peer is not the daemon's owner
METHOD_NOT_FOUND = -32601
UNAVAILABLE = -32000  # the upstream cannot do it now (not connected, timed out)

Handler = Callable[[AdminPort, dict[str, Any], Connection], Awaitable[dict[str, Any]]]


async def _list(port: AdminPort, _params: dict[str, Any], _conn: Connection) -> dict[str, Any]:
    return {"upstreams": port.list_upstreams()}


async def _restart(port: AdminPort, params: dict[str, Any], _conn: Connection) -> dict[str, Any]:
    return await port.restart_upstream(_name(params))


async def _relist(port: AdminPort, params: dict[str, Any], _conn: Connection) -> dict[str, Any]:
    return await port.relist_upstream(_name(params))


async def _approve(port: AdminPort, params: dict[str, Any], conn: Connection) -> dict[str, Any]:
    return await port.decide_upstream(_name(params), "approved", conn.principal)


async def _reject(port: AdminPort, params: dict[str, Any], conn: Connection) -> dict[str, Any]:
    return await port.decide_upstream(_name(params), "rejected", conn.principal)


async def _reload(port: AdminPort, _params: dict[str, Any], _conn: Connection) -> dict[str, Any]:
    return await port.reload_config()


METHODS: dict[str, Handler] = {
    "toolatlas/upstream/list": _list,
    "toolatlas/upstream/restart": _restart,
    "toolatlas/upstream/relist": _relist,
    "toolatlas/upstream/approve": _approve,
    "toolatlas/upstream/reject": _reject,
    "toolatlas/reload": _reload,
}


async def _tools(port: AdminPort, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    return {"tools": port.tool_definitions(conn, servers_arg(params.get("servers")))}


# Methods any peer may use: they answer within its own access rules.
PUBLIC: dict[str, Callable[[AdminPort, Connection, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "toolatlas/tools": _tools,
}


def _name(params: dict[str, Any]) -> str:
    name = params.get("name")
    if not isinstance(name, str) or not name:
        raise BadInput("`name` must be an upstream's name (a non-empty string); `toolatlas upstream list` shows them")
    return name


def _failed(method: str, result: dict[str, Any]) -> str | None:
    """The reason a command that ran did not succeed (a restart not back, a reload refused)."""
    if method.endswith("/restart") and not result.get("ok"):
        return str(result.get("error"))
    if method == "toolatlas/reload" and not result.get("applied"):
        return str(result.get("error"))
    return None


def _error(id_: str | int, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}


class AdminLane:
    """`await lane(conn, id, method, params)` is the JSON-RPC response to one `toolatlas/*`
    request from `conn`; it never raises (a bug is answered -32603 and logged)."""

    def __init__(self, port: AdminPort, *, daemon_uid: int | None = None) -> None:
        self.port = port
        self.daemon_uid = os.getuid() if daemon_uid is None else daemon_uid

    def __repr__(self) -> str:
        return f"<AdminLane owner uid {self.daemon_uid}>"

    async def __call__(
        self, conn: Connection, id_: str | int, method: str, params: dict[str, Any] | None,
    ) -> dict[str, Any]:
        params = params or {}
        REQUEST.set(Request(id_, method[:80]))
        public = PUBLIC.get(method)
        if public is not None:
            try:
                return {"jsonrpc": "2.0", "id": id_, "result": await public(self.port, conn, params)}
            except BadInput as exc:
                return _error(id_, INVALID_PARAMS, str(exc))
            except Exception:
                log.exception("%r failed", method)
                return _error(id_, INTERNAL_ERROR, f"internal error: {method} failed; the daemon's log has the details")
        refusal = admin_refusal(conn.uid, self.daemon_uid)
        if refusal is not None:
            log.warning("refused %r from pid %s uid %s: not the daemon's owner", method[:80], conn.pid, conn.uid)
            self.port.audit_admin(conn, method, upstream=None, outcome="refused", message=refusal)
            return _error(id_, FORBIDDEN, f"{method[:80]} refused: {refusal}")
        handler = METHODS.get(method)
        upstream = params.get("name") if isinstance(params.get("name"), str) else None
        if handler is None:
            self.port.audit_admin(conn, method, upstream=None, outcome="bad_input", message="unknown method")
            return _error(id_, METHOD_NOT_FOUND, f"unknown operator method {method[:80]!r}; the daemon offers "
                          f"{', '.join([*METHODS, *PUBLIC])}")
        try:
            result = await handler(self.port, params, conn)
        except BadInput as exc:
            self.port.audit_admin(conn, method, upstream=upstream, outcome="bad_input", message=str(exc))
            return _error(id_, INVALID_PARAMS, str(exc))
        except ToolatlasError as exc:  # an upstream not connected, too slow, gone meanwhile
            self.port.audit_admin(conn, method, upstream=upstream, outcome="failed", message=str(exc))
            return _error(id_, UNAVAILABLE, str(exc))
        except Exception:
            log.exception("operator command %r failed", method)
            self.port.audit_admin(conn, method, upstream=upstream, outcome="error", message="internal error")
            return _error(id_, INTERNAL_ERROR, f"internal error: {method} failed; the daemon's log has the details")
        why = _failed(method, result)
        self.port.audit_admin(conn, method, upstream=upstream, outcome="failed" if why else "ok", message=why)
        return {"jsonrpc": "2.0", "id": id_, "result": result}


__all__ = ["ADMIN_PREFIX", "FORBIDDEN", "METHODS", "PUBLIC", "AdminLane"]
