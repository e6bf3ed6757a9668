"""The optional streamable-HTTP endpoint: the gateway's MCP surface at `http://LISTEN/mcp`.

The same low-level `Server` the Unix socket serves, behind the SDK's
`StreamableHTTPSessionManager` (2025-11-25 sessions with `Mcp-Session-Id`, and the
stateless 2026-07-28 single-exchange POSTs, whose `MCP-Protocol-Version` / `Mcp-Method` /
`Mcp-Name` headers the SDK checks against the body: 400 with -32020/-32021/-32022).

In front of it, for every request, in this order:
1. the path must be `/mcp` (else 404);
2. DNS-rebinding protection: the Host header must be allowed (else 421);
3. a browser's Origin must be allowed (else 403); an allowed one gets CORS answers, its
   preflight OPTIONS one without a token (surface.http_cors);
4. `Authorization: Bearer TOKEN`: the SHA-256 of TOKEN must match a configured token,
   compared in constant time, or TOKEN is a JWT that [http.oauth] accepts (surface.oauth);
   else 401 with `WWW-Authenticate: Bearer` (naming the Protected Resource Metadata when
   OAuth is on, served at `/.well-known/oauth-protected-resource[/PATH]`). A request with no
   Authorization header at all is admitted as `[http] anonymous` when that is set.
5. a JSON POST body is screened as the socket screens a line (surface.rpccheck): a malformed
   message gets 400 with the JSON-RPC error that says what to send instead.
The matching token's name (4) becomes `Connection.token` in the `CONNECTION` contextvar, so the
[[access]] rules apply; the SDK's context streams carry it to the handlers. A legacy session
is bound to the token that opened it (another token gets 404 for that session id); an OAuth
token's claims are those of the token each request carries.

uvicorn serves it on the daemon's event loop (no thread, no signal handlers of its own).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from toolatlas.config import HttpSection, HttpToken, listen_address
from toolatlas.errors import ConfigError
from toolatlas.meta_tools import META_TOOLS
from toolatlas.gateway.ports import DEFAULT_ENDPOINT, Connection, OAuthIdentity, new_connection_id
from toolatlas.surface.http_body import explain_bare, header, json_error, screen_body
from toolatlas.surface.http_cors import preflight, with_cors
from toolatlas.surface.http_h11 import bounded_h11
from toolatlas.surface.http_open import OpenRequests
from toolatlas.surface.http_sessions import (SESSION_IDLE_S, SessionLedger, answer_or_cancel, end_session,
                                             too_many_sessions)
from toolatlas.surface.oauth import WELL_KNOWN, OAuthRejected, Validator, challenge, metadata_url
from toolatlas.surface.server import CONNECTION, Connections

if TYPE_CHECKING:
    from mcp.server.lowlevel.server import Server

log = logging.getLogger(__name__)

PATH = "/mcp"


def hash_token(token: str) -> str:
    """The hex SHA-256 of a bearer token: what `[[http.tokens]] sha256` holds."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenTable:
    """Configured tokens, looked up by the hash of a presented token in constant time."""

    def __init__(self, tokens: Sequence[HttpToken]) -> None:
        self._tokens = [(t.name, bytes.fromhex(t.sha256)) for t in tokens]

    def name_for(self, presented: str) -> str | None:
        """The name of the token whose hash matches, else None. Every entry is compared (no
        early exit), so the time taken does not tell which one, or how much of one, matched."""
        digest = hashlib.sha256(presented.encode("utf-8")).digest()
        found: str | None = None
        for name, expected in self._tokens:
            if hmac.compare_digest(digest, expected):
                found = name
        return found


_META_SCHEMAS = {t["name"]: t["inputSchema"] for t in META_TOOLS}


def meta_tool_input_schema(name: str) -> dict[str, Any] | None:
    """The input schema of a meta-tool; None (the SDK then skips `Mcp-Param-*` checks) for a
    namespaced upstream tool called directly, whose schema is the upstream's to enforce."""
    return _META_SCHEMAS.get(name)


def default_allowed_hosts(host: str, port: int) -> list[str]:
    """The Host values a client reaching the listen address directly sends."""
    hosts = {f"{host}:{port}", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"}
    if ":" in host and not host.startswith("["):
        hosts.add(f"[{host}]:{port}")
    return sorted(hosts)


def _matches(value: str, allowed: Sequence[str]) -> bool:
    for pattern in allowed:
        if value == pattern:
            return True
        if pattern.endswith(":*") and value.startswith(pattern[:-1]) and value[len(pattern) - 1 :].isdigit():
            return True
    return False


def _stream_expiry(who: str | OAuthIdentity, scope: Scope, rpc_method: str | None) -> float | None:
    """When an event stream (a session's GET, a `subscriptions/listen`) opened with an OAuth
    token must end: at the token's expiry, as its next request would be refused then. Other
    requests (a long tools/call) finish what their valid token started."""
    if not isinstance(who, OAuthIdentity) or (scope.get("method") != "GET" and rpc_method != "subscriptions/listen"):
        return None
    return who.expires_at


class HttpEndpoint:
    """Serves `server` over streamable HTTP on `section.listen`; `address` once started."""

    def __init__(
        self, server: "Server[Any]", section: HttpSection, *, max_message_bytes: int = 4 * 1024 * 1024,
        connections: Connections | None = None, max_clients: int = 1024, message_timeout: float = 30.0,
        max_clients_per_principal: int = 256,
        on_denied: Callable[[Connection, str, str | None, str], None] | None = None,
        paths: dict[str, str] | None = None,
    ) -> None:
        """`on_denied(conn, surface, target, reason)` hears every request refused for its
        credentials or its Host/Origin (the audit trail's access_denied). `paths`: the
        [[endpoint]] HTTP paths besides /mcp, each to its endpoint's name."""
        self.on_denied = on_denied
        self.paths = {PATH: DEFAULT_ENDPOINT, **(paths or {})}
        self.host, self.port = listen_address(section)
        self.section = section
        self.server = server
        self.tokens = TokenTable(section.tokens)
        self.oauth = Validator(section.oauth)
        self.max_message_bytes = max_message_bytes
        self.max_clients, self.max_clients_per_principal = max_clients, max_clients_per_principal
        self.message_timeout = message_timeout
        self.allowed_hosts, self.allowed_origins = list(section.allowed_hosts), list(section.allowed_origins)
        self.requests = 0
        # Shared with the socket: a request in flight (an SSE stream too) is a connected client.
        self.connections = connections if connections is not None else Connections()
        self.rejected: dict[int, int] = {}
        self.sessions = SessionLedger()  # each principal's 2025-11-25 sessions, bounded like its requests
        self.open = OpenRequests()  # a reload that removes a credential ends its requests (streams)
        self._manager: StreamableHTTPSessionManager | None = None
        self._uvicorn: Any = None
        if server.get_tool_input_schema is None:
            # 2026-07-28 `Mcp-Param-*` header checks need the called tool's schema; without a
            # lookup the SDK runs the whole tools/list handler before every tools/call.
            server.get_tool_input_schema = meta_tool_input_schema

    def __repr__(self) -> str:
        return f"<HttpEndpoint http://{self.host}:{self.port}{PATH} requests={self.requests}>"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{PATH}"

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            sock = socket.create_server((self.host, self.port), family=family, backlog=128, reuse_port=False)
        except OSError as exc:
            raise ConfigError(f"[http] listen {self.section.listen!r}: cannot bind: {exc.strerror or exc}") from exc
        sock.setblocking(False)
        self.port = sock.getsockname()[1]  # the real port when listen asked for 0
        self._admission_rules()
        return sock

    def _admission_rules(self) -> None:
        """Allowed Host and Origin values from the section (defaults: the bound address)."""
        self.allowed_hosts = list(self.section.allowed_hosts) or default_allowed_hosts(self.host, self.port)
        if not self.section.allowed_hosts and self.host in ("0.0.0.0", "::"):
            log.warning("[http] listens on all interfaces but allowed_hosts is empty: only requests "
                        "addressed to localhost/127.0.0.1 are accepted; list your host names there")
        self.allowed_origins = list(self.section.allowed_origins) or [
            f"http://{h}" for h in self.allowed_hosts if not h.endswith(":*")]

    def reconfigure(self, section: HttpSection, *, max_message_bytes: int, max_clients: int = 1024,
                    message_timeout: float = 30.0, max_clients_per_principal: int = 256) -> None:
        """Apply a reloaded [http] section at once: tokens (a removed token stops working for
        the next request, and requests in flight with it, such as an event stream, end), the
        anonymous principal, Host/Origin rules, the body limit, the requests in flight one
        principal may have, and for new connections the
        connection cap and header timeout.
        `listen` cannot change while running; the reload is refused before this is called."""
        if section.listen != self.section.listen:
            raise ConfigError(f"[http] listen cannot change from {self.section.listen!r} to {section.listen!r} "
                              "without a restart")
        self.section = section
        self.tokens = TokenTable(section.tokens)
        self.oauth.reconfigure(section.oauth)
        self.max_message_bytes = max_message_bytes
        self.max_clients, self.message_timeout = max_clients, message_timeout
        self.max_clients_per_principal = max_clients_per_principal
        if self._uvicorn is not None:
            self._uvicorn.config.limit_concurrency = max_clients  # read by each new connection
        if self._manager is not None:
            self._manager.max_request_body_size = max_message_bytes
        self._admission_rules()
        self.open.end_revoked(token_name=self.tokens.name_for, anonymous=section.anonymous, oauth=lambda token, scope:
                              self.oauth.still_accepts(token, self.origin + str(scope.get("path", "")).rstrip("/")))

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Bind (a bind error raises before started()), serve until cancelled, then close."""
        import uvicorn

        sock = self._bind()
        self._manager = StreamableHTTPSessionManager(
            self.server, json_response=False, max_request_body_size=self.max_message_bytes,
            session_idle_timeout=SESSION_IDLE_S,
        )
        config = uvicorn.Config(
            self, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=2,
            loop="none", ws="none", http=bounded_h11(lambda: self.message_timeout), server_header=False,
            # Over this many connections (or requests in flight) a new request gets 503.
            limit_concurrency=self.max_clients,
        )
        config.load()
        userver = uvicorn.Server(config)
        userver.lifespan = config.lifespan_class(config)
        self._uvicorn = userver
        try:
            async with self._manager.run():
                await userver.startup(sockets=[sock])
                log.info("streamable HTTP endpoint on %s (hosts %s)", self.url, ", ".join(self.allowed_hosts))
                task_status.started()
                try:
                    await anyio.sleep_forever()
                finally:
                    userver.should_exit = userver.force_exit = True
                    with anyio.move_on_after(3, shield=True):
                        await userver.shutdown(sockets=[sock])
        finally:
            sock.close()

    async def stop_accepting(self) -> None:
        """Close the listening socket (for a drain); requests already in flight go on."""
        if self._uvicorn is not None:
            for srv in self._uvicorn.servers:
                srv.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.requests += 1
        if (origin := header(scope, b"origin")) is not None and _matches(origin, self.allowed_origins):
            send = with_cors(send, origin)
        endpoint = self.paths.get(str(scope.get("path", "")).rstrip("/"), DEFAULT_ENDPOINT)
        rejection, who, why = await self._admit(scope)
        if rejection is not None:
            self.rejected[rejection.status_code] = self.rejected.get(rejection.status_code, 0) + 1
            if self.on_denied is not None and rejection.status_code in (401, 403, 421):
                self.on_denied(Connection(id=new_connection_id(), token=""), "http", str(scope.get("path", ""))[:200], why)
            await rejection(scope, receive, send)
            return
        assert who is not None and self._manager is not None
        fresh = (Connection(id=0, oauth=who, endpoint=endpoint) if isinstance(who, OAuthIdentity)
                 else Connection(id=0, token=who, endpoint=endpoint))
        # Binds a legacy session to the principal that opened it (the SDK compares them).
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=f"toolatlas-{fresh.principal}", scopes=[]))
        message = None
        if scope.get("method") == "POST":
            refused, receive, message = await screen_body(scope, receive, self.max_message_bytes)
            if refused is not None:
                await refused(scope, receive, send)
                return
        rpc_method, session_id = getattr(message, "method", None), header(scope, b"mcp-session-id")
        if session_id is None and rpc_method == "initialize" and (full := await self._make_room(fresh, scope)):
            await full(scope, receive, send)
            return
        # No await from this check to `serving`, which counts the request: a burst of requests
        # whose bodies come late cannot all pass it before any is counted.
        if (busy := self.open.over_share(fresh.principal, self.max_clients_per_principal)) is not None:
            self.rejected[429] = self.rejected.get(429, 0) + 1
            await busy(scope, receive, send)
            return
        conn = self.connections.session(session_id) if session_id else None
        if conn is None or conn.principal != fresh.principal or conn.endpoint != endpoint:
            conn = fresh
            conn.id = new_connection_id()
            conn.stateless = session_id is None and rpc_method != "initialize"  # a 2026-07-28 exchange
        elif fresh.oauth is not None:
            conn.oauth = fresh.oauth  # this request's token decides what it may use: its claims may differ
        # A session this request opens shares `conn` with its later requests.
        send = self.sessions.watch(send, session_id, fresh.principal, str(scope.get("method")),
                                   on_open=functools.partial(self.connections.remember, conn=conn))
        ctx_token = CONNECTION.set(conn)
        self.connections.add(conn)
        try:
            with self.sessions.using(session_id or "", fresh.principal):
                async with self.open.serving(conn, scope, send, until=_stream_expiry(who, scope, rpc_method)) as send:
                    await answer_or_cancel(self._manager.handle_request, scope, receive, explain_bare(scope, send),
                                           session_id, message)
        finally:
            self.connections.discard(conn)
            CONNECTION.reset(ctx_token)
            if session_id and scope.get("method") == "DELETE" and conn is self.connections.session(session_id):
                self.connections.forget(session_id)  # the session's own DELETE: another principal's is refused (404)

    async def _make_room(self, fresh: Connection, scope: Scope) -> Response | None:
        """Before `fresh` opens a session: end its least recently used idle ones past its share
        (surface.http_sessions); the 429 when they all have a request in flight."""
        assert self._manager is not None
        share = self.max_clients_per_principal
        victims = self.sessions.make_room(fresh.principal, share)
        if victims is None:
            return too_many_sessions(fresh.principal, share)
        for sid in victims:
            log.info("ending the idle HTTP session %s of %s to make room for a new one (%d sessions at most)",
                     sid[:64], fresh.principal, share)
            await end_session(self._manager.handle_request, sid, scope)
            self.sessions.closed(sid)
            self.connections.forget(sid)
        return None

    @property
    def origin(self) -> str:
        """The endpoint's origin as clients reach it: [http.oauth] resource, else the listen address."""
        return self.section.oauth.resource.rstrip("/") or self.url[: -len(PATH)]

    async def _admit(self, scope: Scope) -> tuple[Response | None, str | OAuthIdentity | None, str]:
        """(refusal, None, why) or (None, the token name or OAuth identity, "")."""
        path = scope.get("path", "")
        well_known = path.startswith(WELL_KNOWN)
        mcp_path = path.rstrip("/")
        if mcp_path not in self.paths and not well_known:
            return json_error(404, f"not found: the MCP endpoint is {PATH}"), None, "not found"
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        host = headers.get("host", "")
        if not _matches(host, self.allowed_hosts):
            log.warning("refused a request with Host %r (not in [http] allowed_hosts)", host[:200])
            return json_error(421, "Host header not allowed"), None, "Host not allowed"
        origin = headers.get("origin")
        if origin is not None and not _matches(origin, self.allowed_origins):
            log.warning("refused a request with Origin %r (not in [http] allowed_origins)", origin[:200])
            return json_error(403, "Origin not allowed"), None, "Origin not allowed"
        if scope.get("method") == "OPTIONS":  # a browser's CORS preflight: it never carries Authorization
            return preflight(origin, headers.get("access-control-request-headers")), None, "preflight"
        if well_known:
            rest = path[len(WELL_KNOWN):].rstrip("/")
            if not self.oauth.enabled or (rest and rest not in self.paths):
                return json_error(404, "not found: no protected resource metadata here"), None, "not found"
            return JSONResponse(self.oauth.metadata(self.origin + (rest or PATH))), None, "metadata"
        auth = headers.get("authorization", "")
        if not auth and self.section.anonymous:
            return None, self.section.anonymous, ""
        scheme, _, presented = auth.partition(" ")
        presented = presented.strip() if scheme.lower() == "bearer" else ""
        name = self.tokens.name_for(presented) if presented else None
        if name is not None:
            return None, name, ""
        meta = metadata_url(self.origin, mcp_path) if self.oauth.enabled else None
        why = "no bearer token" if not auth else "the bearer token is not valid"
        if presented and self.oauth.enabled and self.oauth.looks_like_jwt(presented):
            try:
                return None, await self.oauth.validate(presented, self.origin + mcp_path), ""
            except OAuthRejected as exc:
                why = str(exc)
        header = challenge(meta, "invalid_token" if auth else None, why if auth and meta else None)
        return json_error(401, f"a valid bearer token is required: {why}", {"WWW-Authenticate": header}), None, why


__all__ = ["HttpEndpoint", "PATH", "TokenTable", "default_allowed_hosts", "hash_token"]
