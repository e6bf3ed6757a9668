"""The daemon: one task tree owning the upstream pool, the live catalog, the index and the socket.

The Gateway is what the MCP surface calls: `search`, `execute`, `status`, the listings. The
catalog is kept per upstream and diffed on every tools/list; what gets indexed is the
operator-attested card text (publisher text, marked unattested, where no card exists), and a
tool whose definition no longer matches its signed card is quarantined. The engine is updated
in a worker thread (inserts before deletes, atomic snapshot swap), so a search never sees a
half-built index. Tools of an upstream that is not READY stay indexed but are scoped out of
every search and refused for calls until it recovers.
"""

from __future__ import annotations

import difflib
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types

from toolatlas import access, memory
from toolatlas import events as ev
from toolatlas.catalog.attest import Attestor
from toolatlas.catalog.model import ToolRecord
from toolatlas.catalog.validate import ArgumentValidator
from toolatlas.config import Config, load, metrics_address, secrets
from toolatlas.inputstate import InputStateSealer
from toolatlas.errors import BadInput, ConfigError, ToolatlasError, UpstreamTimeout, UpstreamUnavailable
from toolatlas.metrics import Metrics, StateSnapshot
from toolatlas.names import split
from toolatlas.notify import Notifier, listen_fds, run_watchdog, scrub_environment
from toolatlas.retrieval.embed import usable_cores
from toolatlas.retrieval.engine import Engine, SearchOutcome, ToolDoc
from toolatlas.surface.meta_tools import META_TOOLS
from toolatlas.surface.server import Connection, build_server, fast_lane
from toolatlas.surface.unix import UnixServer
from toolatlas.upstream.pool import Pool
from toolatlas.upstream.state import UpstreamState

log = logging.getLogger(__name__)

# How long tool_search waits for a first index before answering degraded.
INDEX_WAIT_S = 10.0
# How long readiness waits for the first reindex of the upstreams that connected.
FIRST_INDEX_WAIT_S = 900.0
# Queries per catalog version used to measure the mean size of a top-5 tool_search result.
TOKEN_SAMPLE_QUERIES = 8
# Quiet seconds after a catalog change before Rift re-analyses it.
RIFT_DEBOUNCE_S = 1.0
# Largest catalog the daemon runs Rift on (an n x n float32 matrix: 5,000 tools ~ 100 MB).
RIFT_MAX_TOOLS = 5000

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]


# The execute_tool outcome label of each error class (first match wins).
_CALL_OUTCOMES: tuple[tuple[type[ToolatlasError], str], ...] = (
    (BadInput, "bad_input"),
    (UpstreamTimeout, "timeout"),
    (UpstreamUnavailable, "unavailable"),
    (ToolatlasError, "error"),
)


@dataclass(frozen=True)
class InputRetry:
    """What a 2026-07-28 tools/call carries for the input_required flow."""

    input_responses: dict[str, Any] | None = None
    request_state: str | None = None


def record_from_tool(server: str, tool: types.Tool) -> ToolRecord:
    return ToolRecord.make(
        server,
        tool.name,
        tool.description,
        tool.input_schema,
        title=tool.title,
        output_schema=tool.output_schema,
    )


def tool_dict(rec: ToolRecord) -> dict[str, Any]:
    """A tool as a passthrough client's tools/list shows it (also what token figures count)."""
    out: dict[str, Any] = {"name": rec.name, "description": rec.description, "inputSchema": rec.input_schema}
    if rec.title:
        out["title"] = rec.title
    if rec.output_schema:
        out["outputSchema"] = rec.output_schema
    return out


class Gateway:
    """Everything a client connection can ask of the daemon."""

    def __init__(
        self,
        cfg: Config,
        *,
        engine: Engine | None = None,
        metrics: Metrics | None = None,
        events: ev.Events | None = None,
        listen_socket: Any = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics or Metrics()
        self.events = events or ev.Events(secrets=secrets(cfg), log_queries=cfg.daemon.log_queries)
        self.attestor = Attestor(cfg)
        self.validator = ArgumentValidator()
        self.input_states = InputStateSealer()
        # server -> {namespaced name -> record}: the callable tools (quarantined ones excluded).
        self.records: dict[str, dict[str, ToolRecord]] = {}
        # server -> {namespaced name -> indexed document}: what the engine holds for it.
        self.docs: dict[str, dict[str, ToolDoc]] = {}
        self.quarantined: dict[str, dict[str, str]] = {}
        # server -> its tools as last listed (re-attested when card files change).
        self.live: dict[str, list[ToolRecord]] = {}
        self.by_name: dict[str, ToolRecord] = {}
        self.available: set[str] = set()
        self.engine = engine or Engine(
            state_dir=Path(cfg.daemon.state_dir) / "index",
            mode=cfg.search.mode,
            embedder=cfg.search.embedder,
            cache_size=cfg.search.cache_size,
            cache_ttl=cfg.search.cache_ttl,
            query_threads=cfg.search.query_threads,
        )
        self.pool = Pool(cfg.upstream, self._on_tools, observer=self._observe_upstream)
        self.bus: Any = None  # set by build_server: the subscriptions/listen fan-out
        self.http: Any = None  # the streamable-HTTP endpoint when [http] listen is set
        self.server = build_server(self)
        self.unix = UnixServer(
            self.server,
            cfg.daemon.socket,
            mode=int(cfg.daemon.socket_mode, 8),
            owner=cfg.daemon.socket_owner,
            group=cfg.daemon.socket_group,
            max_message_bytes=cfg.daemon.max_message_bytes,
            listen_socket=listen_socket,
            on_bad_message=lambda msg: self.metrics.count_error("bad_client_message"),
            fast_lane=fast_lane(self),
        )
        self.engine_loaded = anyio.Event()
        self.index_ready = anyio.Event()
        self.inflight = 0
        self.draining = False
        self.fast_answers = 0  # tool_search requests the socket's fast lane served (surface.server)
        self._update_lock = anyio.Lock()
        # Searches are CPU work (query embedding, ranking): as many at once as there are
        # cores this process may use (its affinity mask, as the embedder counts them). More
        # threads only thrash the caches and grow the heap (a malloc arena each).
        self._search_limiter = anyio.CapacityLimiter(max(2, usable_cores()))
        self._idle = anyio.Event()
        self._idle.set()
        self._scope = frozenset(cfg.search.scope) or None
        self._embeddings_seen = 0
        self._tokens: dict[str, Any] | None = None
        self._tokens_version = -1
        self._tokens_running = False
        self._tg: anyio.abc.TaskGroup | None = None
        self.rift: Any = None  # the latest RiftReport of the indexed catalog, or None
        self.rift_error: str | None = None
        self._rift_wanted = anyio.Event()
        self.started_at = time.time()
        self.metrics.set_state_source(self._state_snapshot)

    def __repr__(self) -> str:
        return f"<Gateway tools={len(self.by_name)} available={sorted(self.available)} ready={self.index_ready.is_set()}>"

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen, load the index, connect upstreams; started() once the socket listens."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await tg.start(self.unix.run)
            if self.cfg.http.listen:  # the optional streamable-HTTP endpoint (surface/http.py)
                from toolatlas.surface.http import HttpEndpoint

                self.http = HttpEndpoint(self.server, self.cfg.http, max_message_bytes=self.cfg.daemon.max_message_bytes)
                await tg.start(self.http.run)
            task_status.started()
            await anyio.to_thread.run_sync(self.engine.load)
            await self._adopt_restored_index()
            self.engine_loaded.set()
            await tg.start(self.pool.run)
            tg.start_soon(self._recheck_cards)
            tg.start_soon(self._rift_loop)
            await self.pool.wait_settled(max((u.timeouts.connect for u in self.cfg.upstream), default=1.0) + 5)
            # Ready upstreams have listed; their first reindex (embedding a new catalog can take
            # minutes on a small host) must land before the index counts as ready.
            with anyio.move_on_after(FIRST_INDEX_WAIT_S):
                while not self._ready_upstreams() <= self.available:
                    await anyio.sleep(0.02)
            self.index_ready.set()
            log.info("index ready: %d tools from %d upstreams", len(self.by_name), len(self.available))
            await self._notify_list_changed()

    def _observe_upstream(self, upstream: str, kind: str, fields: dict[str, Any]) -> None:
        """Upstream lifecycle into metrics and structured events."""
        if kind == "state":
            self.events.emit(ev.UPSTREAM_STATE_CHANGED, upstream=upstream, **fields)
        elif kind == "reconnect":
            self.metrics.count_reconnect(upstream)
        elif kind == "list_changed":
            self.metrics.count_list_changed(upstream)
        elif kind == "call":
            self.metrics.observe_upstream_call(fields["seconds"], upstream=upstream, operation=fields["operation"])

    async def _adopt_restored_index(self) -> None:
        """Take the documents a restored index snapshot holds as each server's indexed state,
        so the first listing after a restart is diffed against them: unchanged tools are not
        re-indexed, tools gone from the live catalog are removed, and servers no longer in
        the config are dropped now. Nothing becomes callable until its upstream lists it."""
        _version, docs, _vecs = self.engine.catalog_vectors()
        configured = {u.name for u in self.cfg.upstream}
        gone: list[str] = []
        for doc in docs:
            if doc.server in configured:
                self.docs.setdefault(doc.server, {})[doc.name] = doc
            else:
                gone.append(doc.name)
        if gone:
            await anyio.to_thread.run_sync(self._engine_update, [], gone)
            log.info("dropped %d indexed tools of upstreams no longer configured", len(gone))
        if docs:
            self._rift_wanted.set()  # analyse the restored catalog (no update may follow)

    def _ready_upstreams(self) -> set[str]:
        return {st.name for st in self.pool.status() if st.state is UpstreamState.READY}

    async def drain(self, timeout: float) -> None:
        """Stop accepting connections and let in-flight calls finish (bounded)."""
        self.draining = True
        await self.unix.stop_accepting()
        if self.http is not None:
            await self.http.stop_accepting()
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        if self.inflight:
            log.warning("shutting down with %d calls still in flight after %.1f s", self.inflight, timeout)

    async def close_upstreams(self, timeout: float = 20.0) -> None:
        """Stop every upstream session in its owner task (children reaped) before the
        task tree is cancelled."""
        with anyio.move_on_after(timeout, shield=True):
            await self.pool.reconcile([])

    async def reload(self, new: Config) -> dict[str, list[str]]:
        """Apply a re-read config: upstreams added, removed or changed are reconciled; the
        unchanged keep their warm session and index entries. Daemon-level settings that
        need a restart (socket, state_dir, metrics_addr, search mode/embedder/query_threads) are logged."""
        old = self.cfg
        needs_restart = [
            key for key, a, b in (
                ("daemon.socket", old.daemon.socket, new.daemon.socket),
                ("daemon.state_dir", old.daemon.state_dir, new.daemon.state_dir),
                ("daemon.metrics_addr", old.daemon.metrics_addr, new.daemon.metrics_addr),
                ("search.mode", old.search.mode, new.search.mode),
                ("search.embedder", old.search.embedder, new.search.embedder),
                ("search.query_threads", old.search.query_threads, new.search.query_threads),
            ) if a != b
        ]
        if needs_restart:
            log.warning("reload: %s changed; this takes effect only after a restart", ", ".join(needs_restart))
        old_ups = {u.name: u for u in old.upstream}
        new_ups = {u.name: u for u in new.upstream}
        summary = {
            "added": sorted(set(new_ups) - set(old_ups)),
            "removed": sorted(set(old_ups) - set(new_ups)),
            "changed": sorted(n for n in set(old_ups) & set(new_ups) if old_ups[n] != new_ups[n]),
        }
        self.cfg = new
        access.clear_cache()
        self._scope = frozenset(new.search.scope) or None
        self.attestor = Attestor(new)
        self.events.add_secrets(secrets(new))
        self.events.log_queries = new.daemon.log_queries
        await self.pool.reconcile(new.upstream)
        for name in summary["removed"]:
            await self._on_tools(name, None)
            await self._drop_server(name)
        log.info("reload: +%s -%s ~%s", summary["added"], summary["removed"], summary["changed"])
        await self._notify_list_changed()
        return summary

    # -- catalog ---------------------------------------------------------------------------

    async def _drop_server(self, server: str) -> None:
        """Forget every tool of a server that left the config."""
        async with self._update_lock:
            names = list(self.docs.pop(server, {}))
            if names:
                await anyio.to_thread.run_sync(self._engine_update, [], names)
            for name in self.records.pop(server, {}):
                self.by_name.pop(name, None)
            self.quarantined.pop(server, None)
            self.live.pop(server, None)

    def _engine_update(self, upserts: list[ToolDoc], removes: list[str]) -> int:
        """Runs in a worker thread: update the index and count what it cost."""
        version = self.engine.update(upserts, removes)
        anyio.from_thread.run_sync(self._rift_wanted.set)
        self.metrics.count_reindex()
        computed = int(self.engine.stats().get("embeddings_computed", 0))
        if computed > self._embeddings_seen:
            self.metrics.count_embeddings(computed - self._embeddings_seen)
        self._embeddings_seen = computed
        memory.settle_heap()
        return version

    async def _on_tools(self, server: str, tools: list[types.Tool] | None) -> None:
        if tools is None:
            if server in self.available:
                self.available.discard(server)
                log.info("upstream %s is down: its %d tools leave search", server, len(self.records.get(server, {})))
                self.events.emit(ev.CATALOG_CHANGED, server=server, available=False, tools=0)
                await self._notify_list_changed()
            return
        await self.engine_loaded.wait()
        live = [record_from_tool(server, t) for t in tools]
        self.live[server] = live
        await self._apply(server)

    async def _recheck_cards(self) -> None:
        """Re-attest connected upstreams whose card file changed: card files change without
        the upstream's catalog changing (tampering, re-signing after a quarantine). Only
        those: re-applying every upstream's catalog each interval would block the event
        loop for a time that grows with the catalog (py-spy at 100,000 tools: 0.1-0.25 s of
        event-loop time a pass, one upstream of 5,000 tools at a time)."""
        while True:
            interval = self.cfg.cards.recheck_interval
            await anyio.sleep(interval if interval > 0 else 60)
            if interval <= 0:
                continue
            changed = await anyio.to_thread.run_sync(self.attestor.changed_servers)
            for server in changed:
                if server in self.available:
                    await self._apply(server, from_listing=False)

    async def _rift_loop(self) -> None:
        """Re-run Rift over the indexed catalog after changes settle (debounced), in a worker
        thread, reusing the index's vectors: tool_search notes and catalog_status use it."""
        while True:
            await self._rift_wanted.wait()
            while True:  # debounce: wait for a quiet second
                self._rift_wanted = anyio.Event()
                with anyio.move_on_after(RIFT_DEBOUNCE_S):
                    await self._rift_wanted.wait()
                    continue
                break
            try:
                self.rift_error = None
                self.rift = await anyio.to_thread.run_sync(self._run_rift)
            except Exception as exc:  # an analysis failure must never affect serving
                log.warning("rift analysis failed: %s", exc)
                self.rift_error = str(exc)

    def _run_rift(self) -> Any:
        from toolatlas.rift.cli import build_inputs
        from toolatlas.rift.report import analyse

        embedder = self.engine.embedder
        version, docs, vecs = self.engine.catalog_vectors()
        if embedder is None or vecs is None or not docs:
            return None
        if len(docs) > RIFT_MAX_TOOLS:
            # Clustering holds an n x n similarity matrix: past this size it belongs in an
            # offline `toolatlas rift` run, not in the daemon's memory.
            self.rift_error = (f"catalog has {len(docs)} tools, above the {RIFT_MAX_TOOLS} the daemon "
                               "analyses; run `toolatlas rift --config PATH` offline")
            return None
        tools, schemas, token_texts = build_inputs([(d, d.description, d.server_summary, d.tags) for d in docs])
        report = analyse(tools, embedder, schemas=schemas, token_texts=token_texts, vectors=vecs)
        memory.settle_heap()  # the analysis held n x n similarities; its report stays
        log.info("rift: %d clusters over %d tools (index version %d): %s",
                 len(report.clusters), len(docs), version, report.counts())
        return report

    async def _apply(self, server: str, *, from_listing: bool = True) -> None:
        """Attest the server's latest listing and bring index and records in line.

        Serialised by the update lock, and reading `self.live` under it, so a re-check can
        never apply an older listing over a newer one.
        """
        async with self._update_lock:
            live = self.live.get(server)
            if live is None or (not from_listing and server not in self.available):
                return
            verdict = await anyio.to_thread.run_sync(self.attestor.attest, server, live)
            records: dict[str, ToolRecord] = {}
            docs: dict[str, ToolDoc] = {}
            for rec in live:
                text = verdict.texts.get(rec.tool)
                if text is None:
                    continue
                summary, server_summary, tags = text
                records[rec.name] = rec
                docs[rec.name] = ToolDoc(
                    name=rec.name, server=server, tool=rec.tool, description=summary,
                    input_schema=rec.input_schema, server_summary=server_summary, tags=tuple(tags),
                )
            old_docs = self.docs.get(server, {})
            upserts = [d for n, d in docs.items() if old_docs.get(n) != d]
            removes = [n for n in old_docs if n not in docs]
            self.quarantined[server] = dict(verdict.quarantined)
            changed = bool(upserts or removes)
            # Insert before delete: new records become callable first, the index swaps
            # atomically, and only then do removed names disappear.
            old_records = self.records.get(server, {})
            self.by_name.update(records)
            self.records[server] = records
            if changed:
                version = await anyio.to_thread.run_sync(self._engine_update, upserts, removes)
                self.docs[server] = docs
                log.info("catalog of %s changed: %d upserted, %d removed (index version %d)",
                         server, len(upserts), len(removes), version)
            for name in old_records:
                if name not in records:
                    self.by_name.pop(name, None)
        if not from_listing:
            if changed:
                self.events.emit(ev.CATALOG_CHANGED, server=server, available=True, tools=len(records),
                                 upserted=len(upserts), removed=len(removes),
                                 quarantined=len(verdict.quarantined), card=verdict.card_status)
                await self._notify_list_changed()
            return
        was_available = server in self.available
        self.available.add(server)
        if changed or not was_available:
            self.events.emit(
                ev.CATALOG_CHANGED, server=server, available=True, tools=len(records),
                upserted=len(upserts), removed=len(removes), quarantined=len(verdict.quarantined),
                card=verdict.card_status,
            )
            await self._notify_list_changed()

    async def _notify_list_changed(self) -> None:
        """Tell clients whose tools/list would now differ (passthrough views) to re-list:
        legacy sessions by notification, 2026-07-28 clients on their listen streams."""
        if self.bus is not None:
            await self.bus.tools_changed()
        for conn in list(self.unix.connections):
            if conn.session is None or conn.saw_passthrough is None:
                continue
            if not conn.saw_passthrough and not self.passthrough_for(conn):
                continue  # it sees the three meta-tools, which never change
            try:
                with anyio.move_on_after(2):
                    await conn.session.send_tool_list_changed()
            except Exception as exc:  # a client that went away must not stop the others
                log.debug("list_changed to connection %d failed: %s", conn.id, exc)

    # -- who sees what -----------------------------------------------------------------------

    def allowed_servers(self, conn: Connection) -> set[str]:
        """Servers this connection may use: its [[access]] rules, narrowed by the static scope."""
        names = set(access.allowed_servers(self.cfg, conn.uid, conn.gid, conn.token))
        return names & self._scope if self._scope else names

    def passthrough_for(self, conn: Connection) -> bool:
        if not self.index_ready.is_set():
            return True
        return bool(conn.client_name) and conn.client_name in self.cfg.daemon.passthrough_clients

    def visible_records(self, conn: Connection) -> list[ToolRecord]:
        usable = self.allowed_servers(conn) & self.available
        return sorted((r for r in self.by_name.values() if r.server in usable), key=lambda r: r.name)

    def events_emit(self, event: str, **fields: Any) -> None:
        if event == ev.TOOLS_LIST_SERVED and fields.get("passthrough") and not self.index_ready.is_set():
            self.metrics.count_fallback("passthrough")
        self.events.emit(event, **fields)

    # -- meta-tools ----------------------------------------------------------------------------

    def _search_scope(self, servers: list[str] | None, conn: Connection) -> set[str]:
        """The upstreams a search by `conn` covers: those it may use, narrowed by `servers`,
        that are up. Naming a server it may not use (or that does not exist) is BadInput."""
        allowed = self.allowed_servers(conn)
        if servers is not None:
            unknown = sorted(set(servers) - allowed)
            if unknown:
                raise BadInput(
                    f"unknown server(s) {', '.join(unknown)}; servers you can search: {', '.join(sorted(allowed)) or 'none'}"
                )
            allowed &= set(servers)
        return allowed & self.available

    def search_cached(
        self, query: str, top_k: int, servers: list[str] | None, conn: Connection
    ) -> dict[str, Any] | None:
        """`search`'s answer when the result cache holds it (counted and logged as `search`
        does), else None with nothing counted; BadInput as `search` raises it. Synchronous
        and cheap: the socket's lane answers a repeated query with it without a task or a
        thread hop."""
        t0 = time.perf_counter()
        if not self.engine_loaded.is_set():
            return None
        scope = self._search_scope(servers, conn)
        outcome = self.engine.cached(query, top_k, servers=scope) if scope else None
        if outcome is None:
            return None
        return self._search_answer(query, top_k, servers, scope, outcome, outcome.mode, t0)

    async def search(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any]:
        t0 = time.perf_counter()
        scope = self._search_scope(servers, conn)
        outcome: SearchOutcome | None = None
        mode = self.cfg.search.mode
        if not self.engine_loaded.is_set():
            with anyio.move_on_after(INDEX_WAIT_S):
                await self.engine_loaded.wait()
        if self.engine_loaded.is_set() and scope:
            # A repeated query is answered from the result cache here, without a thread hop.
            outcome = self.engine.cached(query, top_k, servers=scope) or await anyio.to_thread.run_sync(
                lambda: self.engine.search(query, top_k, servers=frozenset(scope)),
                limiter=self._search_limiter,
            )
            mode = outcome.mode
        return self._search_answer(query, top_k, servers, scope, outcome, mode, t0)

    def _search_answer(
        self, query: str, top_k: int, servers: list[str] | None, scope: set[str],
        outcome: SearchOutcome | None, mode: str, t0: float,
    ) -> dict[str, Any]:
        """The tool_search result for `outcome` (None: no index yet, or an empty scope),
        counted in the metrics and the event log."""
        degraded = outcome.degraded if outcome is not None else (None if self.engine_loaded.is_set() else "index-not-ready")
        cached = outcome is not None and outcome.cached
        matches: list[dict[str, Any]] = []
        for hit in outcome.hits if outcome is not None else ():
            rec = self.by_name.get(hit.name)
            if rec is None or rec.server not in scope:
                continue
            matches.append(
                {
                    "name": rec.name,
                    "server": rec.server,
                    "tool": rec.tool,
                    "description": rec.description,
                    "inputSchema": rec.input_schema,
                    "score": round(float(hit.score), 6),
                }
            )
        matches = matches[:top_k]
        self._add_rift_notes(matches)
        seconds = time.perf_counter() - t0
        self.metrics.observe_search(seconds, mode=mode, cache_hit=cached, results=len(matches))
        if degraded:
            self.metrics.count_fallback("bm25-only" if degraded == "bm25-only" else "passthrough")
            self.events.emit(ev.TOOL_SEARCH_FALLBACK, reason=degraded, mode=mode)
        self.events.emit(
            ev.TOOL_SEARCH_COMPLETED, query=query, results=len(matches),
            matched_servers=sorted({m["server"] for m in matches}), latency_ms=round(seconds * 1000, 3),
            top_k=top_k, scope=sorted(servers) if servers else "all", mode=mode, cache="hit" if cached else "miss",
        )
        return {"query": query, "matches": matches, "degraded": degraded}

    def _add_rift_notes(self, matches: list[dict[str, Any]]) -> None:
        """Matches that share a HIGH/MEDIUM Rift cluster get a note on what sets them apart."""
        report = self.rift
        if report is None or len(matches) < 2:
            return
        clusters: dict[int, int] = {}
        for m in matches:
            diag = report.tools.get(m["name"])
            if diag is not None:
                clusters[diag.cluster] = clusters.get(diag.cluster, 0) + 1
        for m in matches:
            diag = report.tools.get(m["name"])
            if diag is not None and clusters[diag.cluster] >= 2:
                note = report.note_for(m["name"])
                if note:
                    m["note"] = note

    async def execute(
        self, name: str, arguments: Any, conn: Connection, progress: ProgressFn | None = None,
        *, input: InputRetry | None = None,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Route a call to the owning upstream. `input` is set for 2026-07-28 callers: an
        upstream's input_required then reaches them (with the gateway's sealed state), and
        their retry (input responses + that state) goes back to the same upstream."""
        t0 = time.perf_counter()
        server = (self.by_name[name].server if name in self.by_name else "unknown")
        try:
            result = await self._execute(name, arguments, conn, progress, input)
        except ToolatlasError as exc:
            outcome = next(o for cls, o in _CALL_OUTCOMES if isinstance(exc, cls))
            self._call_done(t0, server, outcome, exc)
            raise
        if isinstance(result, types.InputRequiredResult):
            self._call_done(t0, server, "ok", None, name=name)
            return result
        self._call_done(t0, server, "error" if result.is_error else "ok", None, name=name)
        return result

    def _call_done(self, t0: float, server: str, outcome: str, exc: BaseException | None, name: str = "") -> None:
        seconds = time.perf_counter() - t0
        upstream = server if server in self.records else "unknown"
        self.metrics.observe_execute(seconds, upstream=upstream, outcome=outcome)
        if exc is not None:
            self.metrics.count_error(type(exc).__name__)
            self.events.emit(ev.EXECUTE_TOOL_FAILED, upstream=upstream, outcome=outcome,
                             error_class=type(exc).__name__, latency_ms=round(seconds * 1000, 3))
        else:
            self.events.emit(ev.EXECUTE_TOOL_COMPLETED, upstream=upstream, tool=name, outcome=outcome,
                             latency_ms=round(seconds * 1000, 3))

    async def _execute(
        self, name: str, arguments: Any, conn: Connection, progress: ProgressFn | None,
        input: InputRetry | None,
    ) -> types.CallToolResult | types.InputRequiredResult:
        if self.draining:
            raise UpstreamUnavailable("the gateway is shutting down; retry in a moment")
        rec = self.by_name.get(name)
        allowed = self.allowed_servers(conn)
        if rec is None or rec.server not in allowed:
            parsed = split(name)
            if parsed and parsed[0] in allowed and parsed[0] in self.quarantined:
                tool_reason = self._quarantine_reason(parsed[0], parsed[1])
                if tool_reason:
                    raise BadInput(f"tool {name!r} is quarantined: {tool_reason}")
            raise BadInput(self._unknown_tool_message(name, allowed))
        if rec.server not in self.available:
            st = self.pool.get(rec.server)
            why = f"{st.state.value}: {st.reason}" if st and st.reason else (st.state.value if st else "unknown")
            raise UpstreamUnavailable(f"server {rec.server!r} is not available right now ({why}); try again later")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError as exc:
                raise BadInput(f"`arguments` is a string that is not valid JSON: {exc}") from exc
        if arguments is not None and not isinstance(arguments, dict):
            raise BadInput(f"`arguments` must be an object, got {type(arguments).__name__}")
        problems = self.validator.check(rec, arguments or {})
        if problems:
            listed = "; ".join(problems)
            raise BadInput(
                f"arguments for {rec.name!r} do not match its inputSchema: {listed}. "
                "Fix these and call again."
            )
        principal = f"token:{conn.token}" if conn.token is not None else f"uid:{conn.uid}"
        upstream_state: str | None = None
        if input is not None and input.request_state is not None:
            owner, upstream_state = self.input_states.open(input.request_state, tool=rec.name, principal=principal)
            if owner != rec.server:  # sealed with the tool's name, so this means a reload moved it
                raise BadInput("requestState belongs to another upstream; call the tool again without it")
        elif input is not None and input.input_responses:
            raise BadInput("inputResponses need the requestState of the input_required result they answer")
        if self.inflight == 0:
            self._idle = anyio.Event()
        self.inflight += 1
        try:
            result = await self.pool.call_tool(
                rec.server, rec.tool, arguments, progress_callback=progress,
                input_responses=input.input_responses if input else None,
                request_state=upstream_state, allow_input_required=input is not None,
            )
            if isinstance(result, types.InputRequiredResult):
                return types.InputRequiredResult(
                    input_requests=result.input_requests,
                    request_state=self.input_states.seal(
                        upstream=rec.server, tool=rec.name, principal=principal,
                        upstream_state=result.request_state,
                    ),
                )
            return result
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    def _quarantine_reason(self, server: str, tool_part: str) -> str | None:
        from toolatlas.names import namespaced

        for tool, reason in self.quarantined.get(server, {}).items():
            if namespaced(server, tool) == f"{server}__{tool_part}":
                return reason
        return None

    def _unknown_tool_message(self, name: str, allowed: set[str]) -> str:
        candidates = [n for n, r in self.by_name.items() if r.server in allowed]
        close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
        parsed = split(name)
        if not close and parsed:
            close = difflib.get_close_matches(parsed[1], [self.by_name[n].tool for n in candidates], n=3, cutoff=0.6)
            close = [n for n in candidates if self.by_name[n].tool in close][:3]
        hint = f" Did you mean: {', '.join(close)}?" if close else " Use tool_search to find tools."
        return f"unknown tool {name!r}.{hint}"

    # -- status ----------------------------------------------------------------------------------

    def status(self, conn: Connection) -> dict[str, Any]:
        allowed = self.allowed_servers(conn)
        servers = []
        for st in self.pool.status():
            if st.name not in allowed:
                continue
            quarantined = self.quarantined.get(st.name, {})
            entry = {
                "name": st.name,
                "transport": st.transport,
                "state": st.state.value,
                "tools": len(self.records.get(st.name, {})),
                "searchable": st.name in self.available,
                "reason": st.reason,
                "since": st.since,
                "reconnects": st.reconnects,
                "protocol_version": st.protocol_version,
            }
            if st.name not in self.available and st.state is not UpstreamState.READY:
                entry["not_searchable_because"] = f"upstream is {st.state.value}" + (f": {st.reason}" if st.reason else "")
            if quarantined:
                entry["quarantined"] = dict(sorted(quarantined.items()))
            servers.append(entry)
        stats = self.engine.stats()
        self._ensure_token_report()
        cards = self.attestor.summary()
        cards["servers"] = {k: v for k, v in cards.get("servers", {}).items() if k in allowed}
        return {
            "servers": servers,
            "tools": sum(1 for r in self.by_name.values() if r.server in allowed and r.server in self.available),
            "index": {"ready": self.index_ready.is_set(), **stats},
            "index_version": stats.get("version"),
            "cache": {**(stats.get("cache") or {}), "fast_lane": self.fast_answers},
            "cards": cards,
            "tokens": self._tokens or {"pending": True},
            "rift": self._rift_status(allowed),
            "clients": len(self.unix.connections),
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    def _rift_status(self, allowed: set[str]) -> dict[str, Any]:
        report = self.rift
        if report is None:
            return {"available": False, "reason": self.rift_error or (
                "needs the dense index (embedder)" if self.engine.embedder is None else "not run yet")}
        visible = [c for c in report.clusters if all(split(m) and split(m)[0] in allowed for m in c.members)]
        counts = {r: 0 for r in ("high", "medium", "low")}
        for c in visible:
            if c.risk in counts:
                counts[c.risk] += 1
        return {"available": True, "tools": report.n_tools, "clusters": counts,
                "theta": report.theta, "embedder": report.embedder}

    def _ensure_token_report(self) -> None:
        """Recount catalog tokens in the background when the index version moved."""
        version = self.engine.version
        if (self._tokens_version == version or self._tokens_running or self._tg is None
                or not self.index_ready.is_set()):
            return
        self._tokens_running = True

        async def compute() -> None:
            try:
                report = await anyio.to_thread.run_sync(self._token_report, version)
                self._tokens = report
                self._tokens_version = version
            except Exception as exc:  # token figures are informative; never break status
                log.warning("token accounting failed: %s", exc)
                self._tokens = {"error": str(exc)}
                self._tokens_version = version
            finally:
                self._tokens_running = False

        self._tg.start_soon(compute)

    def _token_report(self, version: int) -> dict[str, Any]:
        from toolatlas.tokens import catalog_token_report

        records = sorted((r for r in self.by_name.values() if r.server in self.available), key=lambda r: r.name)
        samples = []
        step = max(1, len(records) // TOKEN_SAMPLE_QUERIES)
        for rec in records[::step][:TOKEN_SAMPLE_QUERIES]:
            query = " ".join(rec.tool.replace("_", " ").replace("-", " ").split())
            outcome = self.engine.search(query, 5, servers=frozenset(self.available))
            samples.append({"query": query, "matches": [
                {"name": h.name, "server": h.server, "tool": self.by_name[h.name].tool,
                 "description": self.by_name[h.name].description,
                 "inputSchema": self.by_name[h.name].input_schema, "score": round(h.score, 6)}
                for h in outcome.hits if h.name in self.by_name
            ], "degraded": outcome.degraded})
        report = catalog_token_report([tool_dict(r) for r in records], META_TOOLS, samples or None)
        report["index_version"] = version
        return report

    def _state_snapshot(self) -> StateSnapshot:
        return StateSnapshot(
            upstreams=[(st.name, st.state.value, len(self.records.get(st.name, {}))) for st in self.pool.status()],
            index_size=len(self.engine),
            index_version=self.engine.version,
            clients=len(self.unix.connections),
            quarantined=sum(len(q) for q in self.quarantined.values()),
        )


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The HTTP clients log every request at INFO (each upstream ping): keep them quiet.
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, getattr(logging, level)))


async def serve(cfg: Config, *, ready: Callable[[Gateway], None] | None = None) -> None:
    """Run the daemon until SIGTERM/SIGINT; SIGHUP reloads the config.

    systemd: READY=1 once the socket listens and the index is loaded, WATCHDOG=1 pings
    from the event loop, RELOADING=1 around a reload, STOPPING=1 on shutdown.
    """
    notifier = Notifier()
    activated = listen_fds()
    gw = Gateway(cfg, listen_socket=activated[0] if activated else None)
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            await tg.start(run_watchdog, notifier)  # reads WATCHDOG_USEC before the scrub
            scrub_environment()  # children must not inherit NOTIFY_SOCKET, LISTEN_FDS or WATCHDOG_*
            if addr := metrics_address(cfg):
                await tg.start(gw.metrics.serve, *addr)
            await tg.start(gw.run)

            async def announce_ready() -> None:
                await gw.index_ready.wait()
                await notifier.ready(f"serving {len(gw.by_name)} tools from {len(gw.available)} upstreams")
                if ready is not None:
                    ready(gw)

            tg.start_soon(announce_ready)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    await _reload(gw, notifier)
                    continue
                log.info("received %s: draining for up to %.0f s", signal.Signals(signum).name, cfg.daemon.drain_timeout)
                break
        await notifier.stopping()
        await gw.drain(gw.cfg.daemon.drain_timeout)
        await gw.close_upstreams()
        tg.cancel_scope.cancel()
    log.info("stopped")


async def _reload(gw: Gateway, notifier: Notifier) -> None:
    await notifier.reloading()
    try:
        new = await anyio.to_thread.run_sync(load, gw.cfg.source)
        Attestor(new)  # a bad [cards] section is rejected before anything changes
    except ConfigError as exc:
        log.error("reload rejected, keeping the running config: %s", exc)
        gw.events.emit("config_reload_rejected", reason=str(exc))
    else:
        summary = await gw.reload(new)
        gw.events.emit("config_reloaded", **summary)
    await notifier.ready()


def main_serve(cfg: Config) -> int:
    _configure_logging(cfg.daemon.log_level)
    memory.limit_arenas()
    backend_options: dict[str, Any] = {}
    if cfg.daemon.event_loop == "uvloop":
        try:
            import uvloop  # noqa: F401

            backend_options = {"use_uvloop": True}
        except ImportError:
            log.warning("uvloop is not installed; using asyncio's event loop")
    try:
        anyio.run(serve, cfg, backend="asyncio", backend_options=backend_options)
    except BaseExceptionGroup as group:
        raise _sole_leaf(group) from None
    return 0


def _sole_leaf(exc: BaseException) -> BaseException:
    """The one real error inside nested task-group exception groups, if there is just one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


__all__ = ["Gateway", "UpstreamState", "main_serve", "serve"]
