"""What the MCP surface may use of the gateway, and nothing more.

`surface/` imports this module only: the caller's identity (`Connection`), the gateway's port
(`GatewayPort`, a Protocol the facade satisfies), the operator's (`AdminPort`, satisfied by
the composition root), the call values of `toolatlas.calls` and
the records a passthrough listing shows. The surface never writes into the gateway: what the
gateway needs from the surface (live client counts) it reads through `SurfaceStats`, wired by
the composition root (`app.py`).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolatlas.calls import CallOutcome, CallRequest, ElicitFn, InputRequired, LogFn, ProgressFn
from toolatlas.catalog.model import ToolRecord
from toolatlas.guidance import MetaTools


# The endpoint of [daemon] socket and the HTTP endpoint's /mcp.
DEFAULT_ENDPOINT = "default"


_connection_ids = itertools.count(1)


def new_connection_id() -> int:
    """The next client connection's id: one sequence for every surface (socket, HTTP), so two
    connections the daemon has seen never share one (feedback windows, audit lines and
    sessions are keyed by it)."""
    return next(_connection_ids)


@dataclass(eq=False)
class Connection:
    """One client connection: who it is (from the kernel or the HTTP token, never from what
    the client says) and what the surface remembers about it."""

    id: int
    pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] | None = None  # supplementary gids from the kernel (SO_PEERGROUPS); None: not known
    token: str | None = None  # the name of the HTTP bearer token that authenticated it
    # The OAuth identity that authenticated it (HTTP with [http.oauth]); None otherwise.
    oauth: OAuthIdentity | None = None
    client_name: str | None = None
    client_version: str | None = None  # clientInfo.version, as the client said it
    endpoint: str = "default"  # the [[endpoint]] it came in on ("default": [daemon] socket, /mcp)
    session: object = None  # the SDK ServerSession last seen on this connection (surface only)
    protocol_version: str | None = None  # negotiated; set once a request passed the SDK's init gate
    saw_passthrough: bool | None = None  # what its last tools/list returned
    log_level: str | None = None  # set by logging/setLevel (2025-era clients): relay log messages at/above it
    stateless: bool = False  # a 2026-07-28 HTTP request outside any session: this Connection is its alone
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def conversation(self) -> Hashable:
        """What ties a caller's requests together (a search and the call it led to): the
        connection; for stateless HTTP requests, each a Connection of its own, who is calling,
        on which endpoint, with the client it names."""
        return ("stateless", self.endpoint, self.principal, self.client_name) if self.stateless else self.id

    @property
    def principal(self) -> str:
        """A stable name for who is calling: `oauth:ISSUER#SUB`, `token:NAME` or `uid:N`;
        `unauthenticated` for an HTTP request that presented no valid credential (token "")."""
        if self.token == "":
            return "unauthenticated"
        if self.oauth is not None:
            return f"oauth:{self.oauth.issuer}#{self.oauth.subject}"
        return f"token:{self.token}" if self.token is not None else f"uid:{self.uid}"


@dataclass(frozen=True)
class OAuthIdentity:
    """Who a validated OAuth access token speaks for: its issuer, `sub`, the names of its
    `groups`/`roles` claims and its `scope` values (what [[access]] `oauth_*` keys match),
    and when it stops being accepted (`exp` plus the leeway, Unix seconds)."""

    issuer: str
    subject: str
    groups: frozenset[str] = frozenset()
    scopes: frozenset[str] = frozenset()
    expires_at: float | None = None


@dataclass(frozen=True)
class Request:
    """The client request being served: its JSON-RPC id and how it came in (`tools/list`,
    `tool_search`, `execute_tool`, `direct` for a namespaced tools/call, `catalog_status`,
    or an operator method). Set by the surface in `REQUEST` for the gateway's audit events."""

    id: str | int | None
    via: str


# The request the current task serves (the surface sets it per request; None in-process).
REQUEST: ContextVar[Request | None] = ContextVar("toolatlas_request", default=None)


@dataclass(frozen=True)
class Page:
    """One page of a federated list (resources, resource templates, prompts): wire-form
    items and the cursor of the next page, if any."""

    items: list[dict[str, Any]]
    next_cursor: str | None


# Log levels from the least to the most severe (RFC 5424, as MCP names them).
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class SurfaceStats(Protocol):
    """What the gateway reads back from the surface for catalog_status and metrics."""

    def client_count(self) -> int: ...

    def client_counts(self) -> dict[str, int]:
        """Live client connections by endpoint name."""
        ...

    def fast_answers(self) -> int: ...


class GatewayPort(Protocol):
    """Everything a client connection can ask of the daemon."""

    @property
    def default_top_k(self) -> int: ...

    @property
    def starting(self) -> bool:
        """No index is ready yet: upstreams are still listing, so a tools/list may grow and
        carries no cache hint (list_changed follows when the meta-tools take over)."""
        ...

    def instructions(self, conn: Connection | None) -> str:
        """The MCP `instructions` for `conn` (None: no caller known): names only what it may use."""
        ...

    def meta_tools(self, conn: Connection) -> MetaTools:
        """The three meta-tools as `conn` reads them (rendered templates), with a fingerprint
        that changes whenever their text does."""
        ...

    def passthrough_for(self, conn: Connection) -> bool: ...

    def visible_records(self, conn: Connection) -> list[ToolRecord]: ...

    def tools_listed(self, conn: Connection, *, passthrough: bool, tools: int) -> None: ...

    def bad_message(self) -> None: ...

    def denied(self, conn: Connection, surface: str, target: str | None, reason: str) -> None:
        """Record an access denial the surface decided (an HTTP request without a valid
        token): the `access_denied` audit event and its counter."""
        ...

    async def search(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any]:
        """tool_search; `top_k` 0 (meta_tools.AUTO_TOP_K): the caller left it out, so the
        gateway picks how many (up to default_top_k), or answers none and a `note`."""
        ...

    def search_cached(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any] | None: ...

    async def execute(self, call: CallRequest, conn: Connection) -> CallOutcome: ...

    def status(self, conn: Connection) -> Mapping[str, Any]: ...

    def may_use(self, conn: Connection, server: str) -> bool:
        """Whether `conn` may use upstream `server` (its access rules)."""
        ...

    async def listing(self, kind: str, conn: Connection, cursor: str | None) -> Page:
        """A page of "resources", "templates" or "prompts" as `conn` may see them; BadInput
        for a stale or foreign cursor."""
        ...

    async def read_resource(self, uri: str, conn: Connection) -> dict[str, Any]:
        """resources/read (wire-form result); NotFound, BadInput, or an upstream's error."""
        ...

    async def get_prompt(self, name: str, arguments: dict[str, str] | None, conn: Connection) -> dict[str, Any]:
        """prompts/get of a namespaced prompt (wire-form result); NotFound or an upstream's error."""
        ...

    async def set_log_level(self, level: str) -> None:
        """A client asked for log messages at `level` and above: upstreams are asked for them."""
        ...


class AdminPort(Protocol):
    """The operator commands: `toolatlas upstream list|restart|relist` and `toolatlas reload`.

    The surface serves them only on the Unix socket, only to the daemon's owner (surface.admin),
    and records each one with `audit_admin`. Errors are `toolatlas.errors` types: BadInput (an
    unknown or disabled upstream; the message lists the configured ones), UpstreamUnavailable,
    UpstreamTimeout; their messages are redacted. A failed restart or a refused reload is a
    result (`ok` / `applied` false, with the reason), not an error."""

    def list_upstreams(self) -> list[dict[str, Any]]:
        """Each upstream: name, transport, state, tools, pid (stdio), reason, last_error, ..."""
        ...

    async def restart_upstream(self, name: str) -> dict[str, Any]:
        """A fresh session for `name`, waited for (bounded): `{"upstream", "ok", "previous_pid", "error"}`."""
        ...

    async def relist_upstream(self, name: str) -> dict[str, Any]:
        """A forced tools/list: `{"upstream", "tools", "added", "removed", "changed"}`."""
        ...

    async def decide_upstream(self, name: str, decision: str, principal: str) -> dict[str, Any]:
        """`toolatlas upstream approve|reject NAME` (`decision` "approved" or "rejected"):
        `{"upstream", "approval", "previous"}`; BadInput for an unknown upstream or when
        `[daemon] require_approval` is off."""
        ...

    async def reload_config(self) -> dict[str, Any]:
        """What SIGHUP does: `{"applied": true, "added", "removed", "changed", "restart_needed"}`
        or `{"applied": false, "error"}` naming the key; the daemon keeps serving either way."""
        ...

    def audit_admin(self, conn: Connection, method: str, *, upstream: str | None, outcome: str,
                    message: str | None = None) -> None:
        """Record one operator command (event and metric); `outcome` ok|failed|bad_input|refused|error."""
        ...

    def tool_definitions(self, conn: Connection, servers: list[str] | None) -> list[dict[str, Any]]:
        """Every tool `conn` may use (of `servers`, when given; naming one it may not use is
        BadInput), each as a tool_search match shows it, without score: for `toolatlas stubs`."""
        ...


__all__ = [
    "DEFAULT_ENDPOINT", "AdminPort", "CallOutcome", "CallRequest", "Connection", "ElicitFn", "GatewayPort", "InputRequired",
    "LOG_LEVELS", "LogFn", "MetaTools", "OAuthIdentity", "Page", "ProgressFn", "REQUEST", "Request", "SurfaceStats", "new_connection_id",
    "ToolRecord",
]
