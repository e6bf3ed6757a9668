"""Who sees what: [[access]] rules, the static search scope and passthrough clients."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from toolatlas import access
from toolatlas.catalog.model import ToolRecord
from toolatlas.config import Config, Endpoint
from toolatlas.errors import BadInput
from toolatlas.gateway.ports import DEFAULT_ENDPOINT, Connection
from toolatlas.gateway.view import CatalogView

log = logging.getLogger(__name__)


class Visibility:
    """Answers, for one connection, which upstreams and tools it may use and see."""

    def __init__(self, cfg: Config, view: Callable[[], CatalogView], index_ready: Callable[[], bool],
                 blocked: Callable[[], frozenset[str]] = frozenset) -> None:
        """`blocked()`: upstreams that serve nothing now (awaiting approval, or rejected)."""
        self._blocked = blocked
        self._view = view
        self._index_ready = index_ready
        self.configure(cfg)

    def configure(self, cfg: Config) -> None:
        """Take a (re)loaded config; cached identity lookups are dropped. A rule naming a
        token no request can carry is logged (at the start and at each reload)."""
        self._cfg = cfg
        self._scope = frozenset(cfg.search.scope) or None
        access.clear_cache()
        for problem in access.rule_warnings(cfg):
            log.warning("%s", problem)

    def permitted(self, conn: Connection, endpoint: str | None = None) -> set[str]:
        """Servers this connection's [[access]] rules give it, narrowed by the static scope and
        by its endpoint's upstreams (or `endpoint`'s), whether or not they serve now
        (catalog_status shows these)."""
        endpoint = conn.endpoint if endpoint is None else endpoint
        oauth = (conn.oauth.subject, conn.oauth.groups, conn.oauth.scopes) if conn.oauth is not None else None
        names = set(access.allowed_servers(self._cfg, conn.uid, conn.gid, conn.token, oauth, conn.groups,
                                           issuer=conn.oauth.issuer if conn.oauth is not None else None))
        if self._scope:
            names &= self._scope
        if endpoint != DEFAULT_ENDPOINT:
            names &= self.endpoint_upstreams(endpoint)
        return names

    def endpoint_names(self) -> list[str]:
        return [DEFAULT_ENDPOINT, *(ep.name for ep in self._cfg.endpoint)]

    def endpoint(self, conn: Connection) -> Endpoint | None:
        """The [[endpoint]] `conn` came in on (its environment and templates); None for the
        default endpoint ([daemon] socket, /mcp)."""
        return self._cfg.endpoint_by_name(conn.endpoint)

    def endpoint_named(self, name: str) -> Endpoint | None:
        return self._cfg.endpoint_by_name(name)

    def endpoint_upstreams(self, name: str) -> set[str]:
        """The upstreams endpoint `name` serves (every configured one for "default"; none for
        an endpoint a reload removed)."""
        every = {u.name for u in self._cfg.upstream}
        if name == DEFAULT_ENDPOINT:
            return every
        ep = self._cfg.endpoint_by_name(name)
        if ep is None:
            return set()
        return every if "*" in ep.upstreams else every & set(ep.upstreams)

    def allowed_servers(self, conn: Connection) -> set[str]:
        """Servers this connection may use: `permitted`, less those not approved."""
        return self.permitted(conn) - self._blocked()

    def configured(self, server: str) -> bool:
        """Whether `server` is an upstream of the running config."""
        return self._cfg.upstream_by_name(server) is not None

    def passthrough_for(self, conn: Connection) -> bool:
        """Whether the connection lists every tool instead of the meta-tools: configured
        passthrough clients, and everyone while no index is ready yet."""
        return not self._index_ready() or self.passthrough_client(conn)

    def passthrough_client(self, conn: Connection) -> bool:
        """Whether the connection's client is named in `[daemon] passthrough_clients`."""
        return bool(conn.client_name) and conn.client_name in self._cfg.daemon.passthrough_clients

    def visible_records(self, conn: Connection) -> list[ToolRecord]:
        view = self._view()
        usable = self.allowed_servers(conn) & view.available
        return sorted((r for r in view.by_name.values() if r.server in usable), key=lambda r: r.name)

    def search_scope(self, servers: list[str] | None, allowed: set[str],
                     held: Mapping[str, str] | None = None) -> set[str]:
        """The upstreams a search covers: those the caller may use (`allowed`, from
        `allowed_servers`), narrowed by `servers`, that are up. Naming a server it may not
        use (or that does not exist) is BadInput; one of `held` (its rules give it the
        server, which serves nothing now: server -> why) is named with its reason."""
        if servers is not None:
            if not servers:
                raise BadInput("`servers` is an empty list; leave it out to search every server you can use, or name "
                               f"some of: {', '.join(sorted(allowed)) or 'none'}")
            unknown = sorted(set(servers) - allowed)
            if unknown:
                held = held or {}
                said = [f"server {s!r} serves nothing now ({held[s]})" for s in unknown if s in held]
                if other := [s for s in unknown if s not in held]:
                    said.insert(0, f"unknown server(s) {_few(other)}")
                raise BadInput(f"{'; '.join(said)}; servers you can search: {', '.join(sorted(allowed)) or 'none'}")
            return allowed & set(servers) & self._view().available
        return allowed & self._view().available


SHOWN_NAMES = 10  # of a caller's unknown server names, an error quotes at most these
SHOWN_NAME_CHARS = 64  # characters of each


def _few(names: Sequence[str]) -> str:
    """A caller's names as an error quotes them: a reply must not grow with what it sent."""
    shown = [n if len(n) <= SHOWN_NAME_CHARS else n[:SHOWN_NAME_CHARS] + "..." for n in names[:SHOWN_NAMES]]
    return ", ".join(shown) + (f" (+{len(names) - SHOWN_NAMES} more)" if len(names) > SHOWN_NAMES else "")


__all__ = ["Visibility"]
