"""The live catalog as an immutable value, and the pure step that plans each change to it.

`CatalogView` is what every reader sees: search, calls, status, token accounting and Rift
read one view, published by a single assignment in `LiveCatalog`, and never a map that
changes under them (a worker thread may iterate a view while the loop publishes the next).

A change is computed by a pure function (`plan_listing`, `plan_down`, `plan_drop`): the old
view plus what happened gives a `Plan` holding the index work (upserts, removes) and the two
views to publish around it. `interim` makes new tools callable before the index swaps;
`final` removes what left only after it (insert before delete, so search never goes dark).
The I/O runs in `LiveCatalog`; nothing here touches the engine, the network or the clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from toolatlas.catalog.attest import AttestResult
from toolatlas.catalog.model import ToolRecord
from toolatlas.names import namespaced
from toolatlas.retrieval.engine import ToolDoc

_EMPTY_RECORDS: Mapping[str, ToolRecord] = MappingProxyType({})
_EMPTY_DOCS: Mapping[str, ToolDoc] = MappingProxyType({})
_EMPTY_REASONS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ServerCatalog:
    """One upstream's part of the catalog.

    `listing`: its tools as last listed (None until it first lists); `records`: the callable
    ones by namespaced name (quarantined ones excluded); `docs`: what the index holds for it;
    `quarantined`: upstream tool name -> reason; `problems`: upstream tool name -> what was cut
    at ingest (`ToolRecord.problems`); `verdict`: the last card attestation; `available`: its
    upstream is up and its tools are in search.
    """

    listing: tuple[ToolRecord, ...] | None = None
    records: Mapping[str, ToolRecord] = field(default_factory=lambda: _EMPTY_RECORDS)
    docs: Mapping[str, ToolDoc] = field(default_factory=lambda: _EMPTY_DOCS)
    quarantined: Mapping[str, str] = field(default_factory=lambda: _EMPTY_REASONS)
    problems: Mapping[str, str] = field(default_factory=lambda: _EMPTY_REASONS)
    verdict: AttestResult | None = None
    available: bool = False


@dataclass(frozen=True, slots=True)
class CatalogView:
    """Every upstream's catalog at one instant. Build new ones with `with_server`/`without`."""

    servers: Mapping[str, ServerCatalog] = field(default_factory=lambda: MappingProxyType({}))
    by_name: Mapping[str, ToolRecord] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def available(self) -> frozenset[str]:
        return frozenset(n for n, s in self.servers.items() if s.available)

    def server(self, name: str) -> ServerCatalog:
        return self.servers.get(name) or ServerCatalog()

    def with_server(self, name: str, entry: ServerCatalog, *, keep_names: Mapping[str, ToolRecord] | None = None) -> CatalogView:
        """This view with `name`'s entry replaced; `keep_names` stay callable too (the
        interim view of insert-before-delete)."""
        servers = dict(self.servers)
        servers[name] = entry
        return _view(servers, {name: keep_names} if keep_names else None)

    def without(self, name: str) -> CatalogView:
        servers = dict(self.servers)
        servers.pop(name, None)
        return _view(servers)

    def quarantine_reason(self, server: str, tool_part: str) -> str | None:
        """Why the tool a caller named `server__tool_part` is quarantined, else None."""
        wanted = f"{server}__{tool_part}"
        for tool, reason in self.server(server).quarantined.items():
            if namespaced(server, tool) == wanted:
                return reason
        return None


def _view(servers: dict[str, ServerCatalog], extra: Mapping[str, Mapping[str, ToolRecord]] | None = None) -> CatalogView:
    by_name: dict[str, ToolRecord] = {}
    for name, entry in servers.items():
        if extra and name in extra:
            by_name.update(extra[name])
        by_name.update(entry.records)
    return CatalogView(servers=MappingProxyType(servers), by_name=MappingProxyType(by_name))


@dataclass(frozen=True, slots=True)
class Plan:
    """What one catalog change does: index work, then the views to publish around it."""

    server: str
    upserts: tuple[ToolDoc, ...]
    removes: tuple[str, ...]
    interim: CatalogView  # published before the index update: new records callable, old kept
    final: CatalogView  # published after it
    became_available: bool = False
    became_unavailable: bool = False

    @property
    def index_changed(self) -> bool:
        return bool(self.upserts or self.removes)

    @property
    def visible_change(self) -> bool:
        """Whether clients' lists or search results change (worth an event and list_changed)."""
        return self.index_changed or self.became_available or self.became_unavailable


def documents(server: str, listing: Sequence[ToolRecord], verdict: AttestResult) -> tuple[dict[str, ToolRecord], dict[str, ToolDoc]]:
    """The callable records and indexed documents of a listing under a card verdict: the
    attested text where a card vouches for a tool, publisher text otherwise, nothing for a
    quarantined tool."""
    records: dict[str, ToolRecord] = {}
    docs: dict[str, ToolDoc] = {}
    for rec in listing:
        text = verdict.texts.get(rec.tool)
        if text is None:
            continue
        summary, server_summary, tags = text
        records[rec.name] = rec
        docs[rec.name] = ToolDoc(
            name=rec.name, server=server, tool=rec.tool, description=summary,
            input_schema=rec.input_schema, server_summary=server_summary, tags=tuple(tags),
        )
    return records, docs


def plan_listing(
    view: CatalogView, server: str, listing: Sequence[ToolRecord], verdict: AttestResult, *, available: bool = True,
) -> Plan:
    """An upstream listed `listing` (or its card was re-checked) and `verdict` says what
    may be served: index what changed, publish the new records, drop what left."""
    old = view.server(server)
    records, docs = documents(server, listing, verdict)
    upserts = tuple(d for n, d in docs.items() if old.docs.get(n) != d)
    removes = tuple(n for n in old.docs if n not in docs)
    entry = ServerCatalog(
        listing=tuple(listing), records=MappingProxyType(records), docs=MappingProxyType(docs),
        quarantined=MappingProxyType(dict(verdict.quarantined)),
        problems=MappingProxyType({r.tool: "; ".join(r.problems) for r in listing if r.problems}), verdict=verdict,
        available=available,
    )
    return Plan(
        server=server, upserts=upserts, removes=removes,
        # The interim keeps the old documents (the index has not changed yet) and the old
        # availability: an upstream's first listing serves once its tools are indexed.
        # A tool the verdict quarantines is refused at once, not kept callable until the swap.
        interim=view.with_server(server, replace(entry, docs=old.docs, available=old.available),
                                 keep_names={n: r for n, r in old.records.items() if r.tool not in verdict.quarantined}),
        final=view.with_server(server, entry),
        became_available=available and not old.available,
        became_unavailable=old.available and not available,
    )


def plan_down(view: CatalogView, server: str) -> Plan:
    """The upstream's session was lost: its tools stay indexed but leave search and calls."""
    old = view.server(server)
    after = view.with_server(server, replace(old, available=False)) if server in view.servers else view
    return Plan(server=server, upserts=(), removes=(), interim=after, final=after, became_unavailable=old.available)


def plan_drop(view: CatalogView, server: str) -> Plan:
    """The upstream left the config: forget its tools everywhere."""
    old = view.server(server)
    after = view.without(server)
    return Plan(server=server, upserts=(), removes=tuple(old.docs), interim=after, final=after,
                became_unavailable=old.available)


def plan_restored(view: CatalogView, restored: Sequence[ToolDoc], configured: frozenset[str]) -> tuple[CatalogView, tuple[str, ...]]:
    """Adopt the documents a restored index snapshot holds as each configured server's indexed
    state (so its first listing is diffed against them); the names of servers no longer
    configured are returned for removal. Nothing becomes callable until its upstream lists."""
    docs: dict[str, dict[str, ToolDoc]] = {}
    gone: list[str] = []
    for doc in restored:
        if doc.server in configured:
            docs.setdefault(doc.server, {})[doc.name] = doc
        else:
            gone.append(doc.name)
    servers = dict(view.servers)
    for name, held in docs.items():
        servers[name] = replace(view.server(name), docs=MappingProxyType(held))
    return _view(servers), tuple(gone)


__all__ = ["CatalogView", "Plan", "ServerCatalog", "documents", "plan_down", "plan_drop", "plan_listing", "plan_restored"]
