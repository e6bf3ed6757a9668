"""catalog_status for a connection, and the state the Prometheus collector reads per scrape.
Both are computed from one `CatalogView` and the pool's status at the time of the call."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio.abc

from toolatlas.catalog.attest import AttestResult
from toolatlas.gateway.approval import held_reason
from toolatlas.gateway.catalog import LiveCatalog
from toolatlas.gateway.ports import Connection, SurfaceStats
from toolatlas.gateway.tokens import Scope, TokenReporter
from toolatlas.gateway.visibility import Visibility
from toolatlas.guidance import MetaTools
from toolatlas.metrics import StateSnapshot
from toolatlas.names import split
from toolatlas.redact import Redactor
from toolatlas.rift.runner import RiftRunner
from toolatlas.upstream.pool import Pool
from toolatlas.upstream.state import UpstreamState

# Tools listed per server under `problems` (what ingest cut or repaired); the rest are only counted.
PROBLEMS_SHOWN = 50
# index figures of every caller's searches: null for a caller that may not use every server
ACTIVITY = ("searches", "degraded_searches", "lone_queries", "cache")
# What a call to a tool of an upstream that is still connecting is told to wait, in seconds.
STARTING_RETRY_S = 2


class NoSurface:
    """Surface figures before a surface is attached (in-process use)."""

    def client_count(self) -> int:
        return 0

    def client_counts(self) -> dict[str, int]:
        return {}

    def fast_answers(self) -> int:
        return 0


class StatusService:
    """Builds catalog_status answers and metric snapshots."""

    def __init__(
        self, catalog: LiveCatalog, visibility: Visibility, pool: Pool, tokens: TokenReporter, rift: RiftRunner,
        *, index_ready: Callable[[], bool], redactor: Redactor | None = None,
        environment: Callable[[Connection], str] = lambda _conn: "default",
        meta_tools: Callable[[Connection], MetaTools] | None = None,
        approval: Callable[[str, str], str] = lambda _name, _state: "active",
    ) -> None:
        """`environment(conn)`: the environment label that connection is served with;
        `meta_tools(conn)`: the meta-tools as it reads them (what its token figures count);
        `approval(name, state)`: an upstream's approval lifecycle state (gateway.approval)."""
        self._approval = approval
        self._redact = redactor or Redactor()
        self._environment = environment
        self._meta_tools = meta_tools
        self._catalog = catalog
        self._visibility = visibility
        self._pool = pool
        self._tokens = tokens
        self._rift = rift
        self._index_ready = index_ready
        self.surface: SurfaceStats = NoSurface()
        self.started_at = time.time()
        # Extra catalog_status sections by name, computed per call for the caller's scope (None:
        # every server): `learning`, the shared store's `store`.
        self.sections: dict[str, Callable[[Scope], Any]] = {}

    def unavailable_reason(self, server: str) -> str:
        """`state: reason` of an upstream that is not serving, for call errors."""
        st = self._pool.get(server)
        if st is None:
            return "unknown"
        return f"{st.state.value}: {st.reason}" if st.reason else st.state.value

    def unsearchable(self, server: str) -> str:
        """Why configured upstream `server`'s tools are out of tool_search now, one sentence
        for a model (redacted: an upstream's reason may quote its stderr or URL)."""
        why = self.not_listed(server)
        st = self._pool.get(server)
        if why is None and st is not None and st.state is UpstreamState.READY:  # listed, its index not swapped in yet
            why = f"upstream {server!r} is connected and its tools are being indexed; search again in a moment"
        return self._redact(why or f"upstream {server!r} is not available right now ({self.unavailable_reason(server)}); "
                                   "try again later")

    def not_listed(self, server: str) -> str | None:
        """Why the tools of configured upstream `server` are not known yet, saying when to
        retry, while it has never listed them (connecting, or failing to connect); None once
        it has, or for an upstream that is not configured, disabled or closed."""
        if self._catalog.view.server(server).listing is not None:
            return None
        st = self._pool.get(server)
        if st is None:
            return None
        if st.state is UpstreamState.CONNECTING:
            # Between two failed attempts (one every backoff step) the last failure is the
            # news: "starting" alone reads as a first start that will soon be done.
            failed = f"; its last attempt failed: {st.last_error}" if st.last_error else ""
            return (f"upstream {server!r} is starting (connecting for {time.time() - st.since:.0f} s{failed}) and "
                    f"has not listed its tools yet; retry in {STARTING_RETRY_S} s")
        if st.state is UpstreamState.READY:
            return f"upstream {server!r} is starting (its tools are being indexed); retry in 1 s"
        if st.state is UpstreamState.DEGRADED:
            retry = f"; next attempt {next_attempt(st.next_retry_in)}" if st.next_retry_in is not None else ""
            return f"upstream {server!r} has not connected yet ({st.reason or 'no reason given'}){retry}"
        return None

    def waiting_for(self, allowed: set[str] | None = None) -> list[str]:
        """What the daemon is still waiting for, one line each, for people: the embedding
        model ("embedding model: exporting (12 s)") and upstreams of `allowed` (None: all)
        that have not listed their tools yet ("upstream notes: connecting (3 s)")."""
        out: list[str] = []
        progress = self._catalog.engine.progress
        if progress.pending:
            # its counts are every server's documents: only for a caller who may see them all
            whole = allowed is None or allowed >= {st.name for st in self._pool.status()}
            out.append(progress.describe(counts=whole))
        view = self._catalog.view
        now = time.time()
        for st in self._pool.status():
            if (allowed is not None and st.name not in allowed) or view.server(st.name).listing is not None:
                continue
            if st.state is UpstreamState.CONNECTING:
                out.append(f"upstream {st.name}: connecting ({now - st.since:.0f} s)")
            elif st.state is UpstreamState.READY:
                out.append(f"upstream {st.name}: indexing its tools")
            elif st.state is UpstreamState.DEGRADED:
                retry = f", next attempt {next_attempt(st.next_retry_in)}" if st.next_retry_in is not None else ""
                out.append(f"upstream {st.name}: not connected ({st.reason or 'no reason given'}{retry})")
        return out

    def status(self, conn: Connection, tg: anyio.abc.TaskGroup | None = None) -> dict[str, Any]:
        """catalog_status as `conn` may see it: every figure (servers, tool counts, index and
        token figures, cards, Rift) covers only the servers it may use. `tg` starts a token
        recount for its scope when the index moved."""
        allowed = self._visibility.allowed_servers(conn)
        permitted = self._visibility.permitted(conn)  # awaiting approval or rejected: shown, not served
        view = self._catalog.view
        # None: the caller sees every configured server, so the global figures are its own.
        upstreams = self._pool.status()
        scope: Scope = None if allowed >= set(view.servers) | {st.name for st in upstreams} else frozenset(allowed)
        self._tokens.ensure(tg, scope, self._meta_tools(conn) if self._meta_tools is not None else None)
        servers = []
        for st in upstreams:
            if st.name not in permitted:
                continue
            entry = view.server(st.name)
            approval = self._approval(st.name, st.state.value)
            out: dict[str, Any] = {
                "name": st.name,
                "transport": st.transport,
                "state": st.state.value,
                "approval": approval,
                "tools": len(entry.records),
                "searchable": entry.available and st.name in allowed,
                "reason": st.reason,
                "since": st.since,
                "reconnects": st.reconnects,
                "protocol_version": st.protocol_version,
            }
            if (held := held_reason(st.name, approval)) is not None:
                out["not_searchable_because"] = held
            elif not entry.available and st.state is not UpstreamState.READY:
                out["not_searchable_because"] = f"upstream is {st.state.value}" + (f": {st.reason}" if st.reason else "")
            if entry.quarantined:
                out["quarantined"] = dict(sorted(entry.quarantined.items()))
            if entry.problems:
                shown = sorted(entry.problems.items())[:PROBLEMS_SHOWN]
                out["problems"] = dict(shown)
                if len(entry.problems) > len(shown):
                    out["problems_not_shown"] = len(entry.problems) - len(shown)
            servers.append(out)
        engine = self._catalog.engine
        stats = engine.stats()
        if scope is not None:
            indexed = sum(len(view.server(n).docs) for n in allowed)
            stats["tools"] = indexed
            stats["servers"] = sum(1 for n in allowed if view.server(n).docs)
            if stats.get("dense_index") is not None:
                stats["dense_index"] = {"live": indexed}  # slots of other servers are not the caller's
            # the model's progress and the embedding counters count every server's documents
            model = stats["model"]
            if not model["total"]:
                share: dict[str, int | None] = {"total": 0, "embedded": 0}
            elif model["embedded"] >= model["total"]:
                share = {"total": indexed, "embedded": indexed}
            else:  # under way: how much of the caller's share is done is not known
                share = {"total": indexed, "embedded": None}
            stats["model"] = {**model, **share}
            # ...and the activity counters count every caller's searches: not this one's to read
            for counter in ("embeddings_computed", "embeddings_cached", "embeddings_shared", *ACTIVITY):
                stats[counter] = None
        verdicts: dict[str, AttestResult] = {n: s.verdict for n, s in view.servers.items()
                                             if s.verdict is not None and n in allowed}
        cards = self._catalog.attestor.summary(verdicts)
        available = view.available
        # Reasons carry upstream stderr, URLs and error texts: no configured secret leaves here.
        report: dict[str, Any] = self._redact.tree({
            "environment": self._environment(conn),
            "servers": servers,
            "tools": sum(1 for r in view.by_name.values() if r.server in allowed and r.server in available),
            "index": {"ready": self._index_ready(), **stats},
            # what the daemon still waits for (the embedding model, upstreams not listed yet)
            "waiting_for": self.waiting_for(allowed),
            "index_version": stats.get("version"),
            "cache": {**stats["cache"], "fast_lane": self.surface.fast_answers()} if scope is None else None,
            "cards": cards,
            "tokens": self._tokens.report(scope) or {"pending": True},
            "rift": self._rift_status(allowed, scope),
            "clients": self.surface.client_count(),
            "uptime_s": round(time.time() - self.started_at, 1),
            **self._endpoints(conn),
            **{name: section(scope) for name, section in self.sections.items()},
        })
        return report

    def _endpoints(self, conn: Connection) -> dict[str, Any]:
        """`endpoint`: the caller's endpoint; `endpoints`: one section per endpoint, each with
        the upstreams it serves that the caller's access rules give it, their searchable tools
        and its live clients."""
        view = self._catalog.view
        clients = self.surface.client_counts()
        sections = []
        for name in self._visibility.endpoint_names():
            ep = self._visibility.endpoint_named(name)
            ups = sorted(self._visibility.permitted(conn, name))
            serving = [u for u in ups if u in view.available and self._approval(u, "ready") == "active"]
            sections.append({
                "name": name,
                "environment": ep.environment if ep is not None else None,
                "templates": ep.templates or None if ep is not None else None,
                "socket": ep.socket or None if ep is not None else None,
                "http_path": ep.http_path or None if ep is not None else "/mcp",
                "upstreams": ups,
                "tools": sum(len(view.server(u).records) for u in serving),
                "clients": clients.get(name, 0),
            })
        mine = next((s for s in sections if s["name"] == conn.endpoint), {"name": conn.endpoint, "upstreams": []})
        return {"endpoint": mine, "endpoints": sections}

    def _rift_status(self, allowed: set[str], scope: Scope) -> dict[str, Any]:
        report = self._rift.report
        if report is None:
            return {"available": False, "reason": self._rift.error or (
                "needs the dense index (embedder)" if self._catalog.engine.embedder is None else "not run yet")}
        visible = [c for c in report.clusters if all(_server_of(m) in allowed for m in c.members)]
        view = self._catalog.view
        n_tools = report.n_tools if scope is None else sum(len(view.server(n).docs) for n in allowed)
        counts = {r: 0 for r in ("high", "medium", "low")}
        for c in visible:
            if c.risk in counts:
                counts[c.risk] += 1
        # index_version: the index the report describes; behind `index.version` while the
        # analysis of a newer catalog waits for its debounce or runs
        return {"available": True, "tools": n_tools, "clusters": counts,
                "theta": report.theta, "embedder": report.embedder, "index_version": self._rift.version}

    def snapshot(self) -> StateSnapshot:
        view = self._catalog.view
        counts = self.surface.client_counts()
        engine = self._catalog.engine
        return StateSnapshot(
            upstreams=[(st.name, st.state.value, len(view.server(st.name).records)) for st in self._pool.status()],
            approvals=[(st.name, self._approval(st.name, st.state.value)) for st in self._pool.status()],
            endpoints=[(name, counts.get(name, 0),
                        sum(len(view.server(u).records) for u in self._visibility.endpoint_upstreams(name)
                            if u in view.available and self._approval(u, "ready") == "active"))
                       for name in self._visibility.endpoint_names()],
            index_size=len(engine),
            index_version=engine.version,
            clients=self.surface.client_count(),
            quarantined=sum(len(s.quarantined) for s in view.servers.values()),
        )


def _server_of(name: str) -> str | None:
    parsed = split(name)
    return parsed[0] if parsed else None



def next_attempt(seconds: float) -> str:
    """When the next attempt comes, for a person or a model: never "in 0 s" (which reads as
    "now, and failing") for a retry under half a second away."""
    return "in under a second" if seconds < 1 else f"in {seconds:.0f} s"


__all__ = ["StatusService", "next_attempt"]
