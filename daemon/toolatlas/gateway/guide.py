"""The meta-tools and `instructions` as one caller reads them: the templates of its
`Guidance` rendered with what it may use (its servers in config order, their domains from
verified cards, its tool count) and the environment label.

Rendered per caller, since the text names servers (a caller never reads the name of a server
its access rules hide), and cached per (guidance, catalog view, servers) for the current view
only: a tools/list costs a dictionary lookup. The fingerprint tells the surface whether a
client's meta-tools changed since it listed them (a reload with new templates, a card that
brings new domains).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence

from toolatlas.config import Config
from toolatlas.errors import ConfigError
from toolatlas.gateway.ports import Connection
from toolatlas.gateway.view import CatalogView
from toolatlas.gateway.visibility import Visibility
from toolatlas.guidance import Domain, Guidance, MetaTools

log = logging.getLogger(__name__)

CACHE_ENTRIES = 64  # distinct (guidance, view, server set) renderings kept
# guidance, view, meta-tools, instructions, a passthrough client's instructions
_Rendering = tuple[Guidance, CatalogView, MetaTools, str, str]


class SurfaceText:
    """Renders the meta-tools and instructions for a connection (see the module docstring)."""

    def __init__(
        self, guidance_for: Callable[[Connection | None], Guidance], visibility: Visibility,
        view: Callable[[], CatalogView], configured: Callable[[], Sequence[str]],
        default_top_k: Callable[[], int] = lambda: 5,
    ) -> None:
        """`guidance_for(conn)`: the template set and environment that connection is served
        with (one per daemon today; per endpoint when endpoints have their own);
        `configured()`: the upstream names in config order; `default_top_k()`: `[search]
        default_top_k` (the text tells the model how many results an omitted top_k gives)."""
        self._default_top_k = default_top_k
        self._guidance_for = guidance_for
        self._visibility = visibility
        self._view = view
        self._configured = configured
        # The guidance and view are kept in the value: an id() is reused once its object is gone.
        self._cache: OrderedDict[tuple[int, int, frozenset[str], int], _Rendering] = OrderedDict()
        self._cached_view: CatalogView | None = None  # the view every cached rendering is of

    def meta_tools(self, conn: Connection) -> MetaTools:
        return self._render(conn)[2]

    def instructions(self, conn: Connection | None) -> str:
        """The template's text; a passthrough client's says its tools are listed, not searched."""
        rendering = self._render(conn)
        return rendering[4] if conn is not None and self._visibility.passthrough_client(conn) else rendering[3]

    def _render(self, conn: Connection | None) -> _Rendering:
        guidance = self._guidance_for(conn)
        view = self._view()
        allowed = frozenset(self._visibility.allowed_servers(conn)) if conn is not None else frozenset()
        top_k = self._default_top_k()
        key = (id(guidance), id(view), allowed, top_k)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is guidance and hit[1] is view:
            self._cache.move_to_end(key)
            return hit
        if view is not self._cached_view:
            # A replaced view never comes back, so its renderings can never be served again,
            # yet each holds the whole catalog of its day: drop them (up to CACHE_ENTRIES
            # superseded catalogs were kept alive otherwise).
            self._cache.clear()
            self._cached_view = view
        servers = [name for name in self._configured() if name in allowed]
        domains = []
        for name in servers:
            verdict = view.server(name).verdict
            card = verdict.card if verdict is not None and verdict.card_status == "verified" else None
            domains.append(Domain(name, card.summary, tuple(card.tags)) if card is not None else Domain(name))
        available = view.available
        tools = sum(len(view.server(n).records) for n in servers if n in available)
        values = guidance.values(servers=servers, domains=domains, tool_count=tools, default_top_k=top_k)
        out = (guidance, view, guidance.meta_tools(values), guidance.instructions(values),
               guidance.instructions(values, passthrough=True))
        self._cache[key] = out
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return out


class Guidances:
    """The template set and environment each connection is served with: its [[endpoint]]'s
    where that sets them (each falling back to the daemon's), else the daemon's. Endpoint
    sets are built when first asked and dropped on reload."""

    def __init__(self, cfg: Config, visibility: Visibility) -> None:
        self._visibility = visibility
        self.configure(cfg)

    def configure(self, cfg: Config, daemon: Guidance | None = None) -> None:
        """`daemon`: the daemon's set, loaded already (a reload checks it before applying)."""
        self._cfg = cfg
        self.daemon = daemon or Guidance.load(cfg.surface.templates, cfg.daemon.environment, cfg.surface.publisher_text)
        self._endpoints: dict[str, Guidance] = {}

    def __call__(self, conn: Connection | None) -> Guidance:
        ep = self._visibility.endpoint(conn) if conn is not None else None
        if ep is None or not (ep.templates or ep.environment):
            return self.daemon
        found = self._endpoints.get(ep.name)
        if found is None:
            cfg = self._cfg
            try:
                found = Guidance.load(ep.templates or cfg.surface.templates, ep.environment or cfg.daemon.environment,
                                      cfg.surface.publisher_text)
            except ConfigError as exc:  # checked when the config loaded; a file edited since then
                log.error("endpoint %s: its templates no longer load (%s); serving the daemon's", ep.name, exc)
                found = self.daemon
            self._endpoints[ep.name] = found
        return found


__all__ = ["Guidances", "SurfaceText"]
