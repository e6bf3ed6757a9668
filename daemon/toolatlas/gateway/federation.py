"""Resources, resource templates and prompts of every upstream, as one collision-free set.

Lists are fetched on demand through the warm sessions (the pool) and cached per upstream
until it announces a change (`resources/list_changed`, `prompts/list_changed`, or a listen
event), its session comes or goes, or CACHE_TTL_S passes. Tool state stays with the catalog.

Names (README "Resources and prompts"):
- a prompt is `server__prompt`, namespaced like a tool (`toolatlas.names`);
- a resource URI and a template's uriTemplate are kept as the upstream wrote them, unless two
  servers the caller may use offer the same one: then each is shown as
  `toolatlas://SERVER/ORIGINAL` (the original verbatim after the server's name). A read of
  that form goes to SERVER; a plain URI goes to the server that lists it, that returned it
  in a tool result (a `resource_link`), or whose template matches it, or to the only server
  offering resources; when several could, the error names the qualified forms to use.

Access is that of tools: a caller sees nothing of a server it may not use, and reading or
getting from one reads exactly like asking for something that does not exist.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import anyio

from toolatlas import events as ev
from toolatlas.errors import BadInput, NotFound, ToolatlasError, UpstreamUnavailable
from toolatlas.gateway.audit import TEXT_CHARS, shown, who
from toolatlas.gateway.ports import Connection, Page
from toolatlas.gateway.visibility import Visibility
from toolatlas.names import namespaced, split
from toolatlas.redact import Redactor
from toolatlas.upstream.pool import Pool
from toolatlas.upstream.state import UpstreamState

log = logging.getLogger(__name__)

SCHEME = "toolatlas://"
PAGE_SIZE = 100  # items per page of our own lists
CACHE_TTL_S = 60.0  # a cached list is refetched after this, announced change or not
URI_CHARS = 2048  # of a caller's URI an error quotes (a URL's customary limit): no reply grows with a request
MAX_LINKS = 4096  # URIs remembered from tool results, for routing reads
KIND_OF = {"resources": "resources", "templates": "resources", "prompts": "prompts"}  # list -> capability
_KEY = {"resources": "uri", "templates": "uriTemplate", "prompts": "name"}

ChangeListener = Callable[[str, str], Awaitable[None]]  # (server, "resources" | "prompts")
# ("resources" | "prompts", whether a connection's list of that kind now differs from what it saw)
AccessListener = Callable[[str, Callable[[Connection], bool]], Awaitable[None]]
_SEEN = {"resources": "federation_resources", "prompts": "federation_prompts"}  # Connection.extra keys


def qualify(server: str, original: str) -> str:
    return f"{SCHEME}{server}/{original}"


def unqualify(uri: str) -> tuple[str, str] | None:
    """(server, original URI) of a `toolatlas://SERVER/ORIGINAL` URI, else None."""
    if not uri.startswith(SCHEME):
        return None
    server, sep, original = uri[len(SCHEME):].partition("/")
    return (server, original) if sep and server and original else None


def template_matches(template: str, uri: str) -> bool:
    """Whether `uri` is an expansion of RFC 6570 `template` (each expression matches a
    non-empty run of characters; enough to route a read, the upstream checks the rest)."""
    parts = re.split(r"\{[^}]*\}", template)
    pattern = ".+?".join(re.escape(p) for p in parts)
    return re.fullmatch(pattern, uri) is not None


def _digest(idents: Sequence[str]) -> str:
    return hashlib.sha256("\0".join(idents).encode()).hexdigest()[:12]


def paginate(items: list[dict[str, Any]], key: str, cursor: str | None, size: int = PAGE_SIZE) -> Page:
    """The page of `items` that `cursor` (one of ours, or None for the first) points at.
    A cursor from a list that has changed since, or not one of ours, is BadInput."""
    digest = _digest([str(i.get(key)) for i in items])
    start = 0
    if cursor:
        try:
            raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
            start, seen = int(raw["o"]), str(raw["d"])
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput("this cursor was not issued by toolatlas; list again without a cursor") from exc
        if seen != digest or not 0 <= start <= len(items):
            raise BadInput("the list changed since this cursor was issued; list again without a cursor")
    end = start + size
    nxt = None
    if end < len(items):
        nxt = base64.urlsafe_b64encode(json.dumps({"o": end, "d": digest}).encode()).decode().rstrip("=")
    return Page(items[start:end], nxt)


class Federation:
    """See the module docstring. `on_change` listeners hear (server, kind) changes."""

    def __init__(self, pool: Pool, visibility: Visibility, order: Callable[[], list[str]],
                 redactor: Redactor | None = None, events: ev.Events | None = None) -> None:
        """`events`: where each read and prompt get is audited (None: nowhere)."""
        self._redact = redactor or Redactor()  # for an upstream's reason, which may quote its stderr or URL
        self._events = events
        self._pool = pool
        self._visibility = visibility
        self._order = order  # configured upstream names, in config order
        self._cache: dict[tuple[str, str], tuple[float, list[dict[str, Any]]]] = {}
        self._links: OrderedDict[str, set[str]] = OrderedDict()
        self._up: set[str] = set()
        self._offered: dict[str, frozenset[str]] = {}  # what each offered when its session last came up
        self._fetching: dict[tuple[str, str], anyio.Lock] = {}  # one fetch per list at a time
        self._dropped = 0  # counts invalidations: a fetch that overlapped one is not cached
        self.on_change: list[ChangeListener] = []
        self.on_access: list[AccessListener] = []  # told at a reload which connections' lists differ

    # -- changes ---------------------------------------------------------------------------

    async def changed(self, server: str, kind: str) -> None:
        """Upstream `server` announced that its `kind` ("resources" or "prompts") changed."""
        self._drop(server, ("resources", "templates") if kind == "resources" else ("prompts",))
        for listener in self.on_change:
            try:
                await listener(server, kind)
            except Exception:  # a listener bug must not stop the others
                log.exception("a %s change listener failed", kind)

    async def session_changed(self, server: str, up: bool) -> None:
        """`server`'s session came (`up`) or went: its lists are refetched, and clients told
        when it offers (or offered) resources or prompts."""
        if up == (server in self._up):
            return
        offered = {k for (s, k) in self._cache if s == server}
        (self._up.add if up else self._up.discard)(server)
        self._drop(server, tuple(_KEY))
        st = self._pool.get(server)
        offers = set(st.offers) if st is not None and up else {KIND_OF[k] for k in offered}
        if up:
            self._offered[server] = frozenset(offers)
        for kind in ("resources", "prompts"):
            if kind in offers:
                await self.changed(server, kind)

    async def reloaded(self) -> None:
        """Access rules may have changed: each client whose resources or prompts would now
        come from other servers than when it last saw them re-lists; the others hear nothing."""
        for kind, listener in itertools.product(("resources", "prompts"), self.on_access):
            await listener(kind, functools.partial(self.resee, kind=kind))

    def resee(self, conn: Connection, kind: str) -> bool:
        """Remember the servers whose `kind` ("resources" or "prompts") `conn` may see now; whether they differ
        from those it saw (its last list, or its listen stream's start). False if it saw none: no list to correct."""
        now = frozenset(self._servers(conn, kind))
        before, conn.extra[_SEEN[kind]] = conn.extra.get(_SEEN[kind]), now
        return before is not None and before != now

    def _drop(self, server: str, kinds: Sequence[str]) -> None:
        self._dropped += 1
        for kind in kinds:
            self._cache.pop((server, kind), None)

    def remember(self, server: str, uris: Sequence[str]) -> None:
        """URIs `server` returned in a tool result: a plain read of one goes there."""
        for uri in uris:
            self._links.setdefault(uri, set()).add(server)
            self._links.move_to_end(uri)
        while len(self._links) > MAX_LINKS:
            self._links.popitem(last=False)

    # -- lists -----------------------------------------------------------------------------

    def _servers(self, conn: Connection, capability: str) -> list[str]:
        allowed = self._visibility.allowed_servers(conn)
        out = []
        for name in self._order():
            st = self._pool.get(name)
            if name in allowed and st is not None and st.state is UpstreamState.READY and capability in st.offers:
                out.append(name)
        return out

    def _down(self, conn: Connection) -> dict[str, str]:
        """Servers `conn` may use whose session is not up now (connecting, reconnecting), in
        config order, each with why: what they offer is unknown until they are back."""
        allowed = self._visibility.allowed_servers(conn)
        out = {}
        for name in self._order():
            st = self._pool.get(name)
            if name in allowed and st is not None and st.state in (UpstreamState.CONNECTING, UpstreamState.DEGRADED):
                out[name] = self._redact(f"upstream {name!r} is {st.state.value}" + (f" ({st.reason})" if st.reason else ""))
        return out

    def _fresh(self, server: str, kind: str) -> list[dict[str, Any]] | None:
        hit = self._cache.get((server, kind))
        return hit[1] if hit is not None and time.monotonic() - hit[0] < CACHE_TTL_S else None

    async def _items(self, server: str, kind: str) -> list[dict[str, Any]]:
        if (fresh := self._fresh(server, kind)) is not None:
            return fresh
        # Many clients listing at once (all re-list on a list_changed) cost one fetch.
        async with self._fetching.setdefault((server, kind), anyio.Lock()):
            if (fresh := self._fresh(server, kind)) is not None:
                return fresh
            return await self._fetch(server, kind)

    async def _fetch(self, server: str, kind: str) -> list[dict[str, Any]]:
        t0, dropped = time.monotonic(), self._dropped
        try:
            items = await self._pool.list_items(server, kind)
        except ToolatlasError as exc:  # one broken upstream must not fail everyone's list
            log.warning("upstream %s: listing its %s failed; leaving them out: %s", server, kind, exc)
            return []
        if dropped == self._dropped:  # else a change was announced meanwhile: this may predate it
            self._cache[(server, kind)] = (t0, items)
        return items

    async def _gather(self, servers: list[str], kind: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}

        async def one(server: str) -> None:
            out[server] = await self._items(server, kind)

        async with anyio.create_task_group() as tg:
            for server in servers:
                tg.start_soon(one, server)
        return out

    async def merged(self, kind: str, conn: Connection) -> list[dict[str, Any]]:
        """Every `kind` item ("resources", "templates", "prompts") `conn` may see, named as
        the module docstring says, in config order then the upstream's order."""
        servers = self._servers(conn, KIND_OF[kind])
        conn.extra[_SEEN[KIND_OF[kind]]] = frozenset(servers)
        per = await self._gather(servers, kind)
        key = _KEY[kind]
        owners: dict[str, int] = {}
        for server in servers:
            for ident in {i[key] for i in per[server]}:
                owners[ident] = owners.get(ident, 0) + 1
        out = []
        for server in servers:
            for item in per[server]:
                shown = dict(item)
                if kind == "prompts":
                    shown["name"] = namespaced(server, item["name"])
                elif owners[item[key]] > 1:
                    shown[key] = qualify(server, item[key])
                out.append(shown)
        return out

    async def page(self, kind: str, conn: Connection, cursor: str | None) -> Page:
        return paginate(await self.merged(kind, conn), _KEY[kind], cursor)

    # -- reads -----------------------------------------------------------------------------

    async def _route(self, uri: str, conn: Connection) -> tuple[str, str]:
        """(server, the upstream's own URI) a read of `uri` by `conn` goes to."""
        unknown = NotFound(f"unknown resource {shown(uri, URI_CHARS)}; resources/list shows what you can read")
        servers = self._servers(conn, "resources")
        down = self._down(conn)
        parsed = unqualify(uri)
        if parsed is not None:
            if parsed[0] in down:
                raise UpstreamUnavailable(f"resource {shown(uri, URI_CHARS)} cannot be read now: {down[parsed[0]]}; try again later")
            if parsed[0] not in servers:
                raise unknown
            return parsed
        linked = self._links.get(uri, ())
        if gone := [s for s in down if s in linked]:  # a tool result of a server that is down now gave it
            raise UpstreamUnavailable(f"resource {shown(uri, URI_CHARS)} cannot be read now: {down[gone[0]]}; try again later")
        candidates = [s for s in servers if s in linked]
        if not candidates:
            listed = await self._gather(servers, "resources")
            candidates = [s for s in servers if any(i["uri"] == uri for i in listed[s])]
        if not candidates:
            templates = await self._gather(servers, "templates")
            candidates = [s for s in servers if any(template_matches(t["uriTemplate"], uri) for t in templates[s])]
        if not candidates and len(servers) == 1:
            candidates = servers
        if not candidates and (maybe := [why for s, why in down.items() if "resources" in self._offered.get(s, ())]):
            raise UpstreamUnavailable(f"resource {shown(uri, URI_CHARS)} is not offered by a server up now, and these offered resources "
                                      f"before they went down: {'; '.join(maybe)}; try again later")
        if not candidates:
            raise unknown
        if len(candidates) > 1:
            forms = " or ".join(qualify(s, uri) for s in candidates)
            raise BadInput(f"resource {shown(uri, URI_CHARS)} could come from {', '.join(candidates)}; read {forms}")
        return candidates[0], uri

    @contextlib.contextmanager
    def _audited(self, event: str, conn: Connection, what: dict[str, str], routed: list[str]) -> Iterator[None]:
        """Write `event` (audit fields, `what`, the upstream once `routed` names it, else
        "unknown", and how it ended) when the block ends; not when it is cancelled."""
        outcome = "error"
        try:
            yield
            outcome = "ok"
        except NotFound:
            outcome = "not_found"
            raise
        except BadInput:
            outcome = "bad_input"
            raise
        except UpstreamUnavailable:
            outcome = "unavailable"
            raise
        except Exception:
            raise
        except BaseException:  # cancelled: nothing was read
            outcome = ""
            raise
        finally:
            if self._events is not None and outcome:
                self._events.emit(event, **{k: v[:TEXT_CHARS] for k, v in what.items()},
                                  upstream=routed[0] if routed else "unknown", outcome=outcome, **who(conn))

    async def read(self, uri: str, conn: Connection) -> dict[str, Any]:
        """resources/read of `uri` for `conn` (wire-form result), audited. Contents come back
        under the URI the caller used. Raises NotFound, BadInput (ambiguous), or the upstream's error."""
        routed: list[str] = []
        with self._audited(ev.RESOURCE_READ_COMPLETED, conn, {"uri": uri}, routed):
            server, original = await self._route(uri, conn)
            routed.append(server)
            result = await self._pool.read_resource(server, original)
        if original != uri:
            for content in result.get("contents", []):
                if content.get("uri") == original:
                    content["uri"] = uri
        return result

    async def get_prompt(self, name: str, arguments: dict[str, str] | None, conn: Connection) -> dict[str, Any]:
        """prompts/get of namespaced `name` for `conn` (wire-form result), audited. Raises NotFound."""
        unknown = NotFound(f"unknown prompt {shown(name)}; prompts/list shows the prompts you can get")
        routed: list[str] = []
        with self._audited(ev.PROMPT_GET_COMPLETED, conn, {"name": name}, routed):
            parsed = split(name)
            if parsed is not None and (why := self._down(conn).get(parsed[0])) is not None:
                raise UpstreamUnavailable(f"prompt {shown(name)} cannot be got now: {why}; try again later")
            if parsed is None or parsed[0] not in self._servers(conn, "prompts"):
                raise unknown
            server = parsed[0]
            prompts = await self._items(server, "prompts")
            original = next((p["name"] for p in prompts if namespaced(server, p["name"]) == name), None)
            if original is None:
                raise unknown
            routed.append(server)
            return await self._pool.get_prompt(server, original, arguments)


__all__ = ["Federation", "Page", "SCHEME", "paginate", "qualify", "template_matches", "unqualify"]
