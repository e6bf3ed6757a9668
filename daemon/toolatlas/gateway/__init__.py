"""The Gateway: a thin facade over services with one concern each.

- `LiveCatalog` (catalog.py): the one owner of catalog state; readers see a `CatalogView`.
- `Visibility` (visibility.py): access rules, scope, passthrough.
- `SearchService` (search.py), `CallService` (calls.py), `StatusService` (status.py).
- `TokenReporter` (tokens.py) and `RiftRunner` (rift/runner.py): background analyses that
  read a view or the index, never live maps.

It satisfies `gateway.ports.GatewayPort`, which is all the MCP surface sees of it. Listeners,
the surface and the upstream pool are wired by the composition root (`toolatlas.app`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from toolatlas import events as ev
from toolatlas.auditlog import AuditFile
from toolatlas.calls import CallOutcome, CallRequest
from toolatlas.catalog.attest import Attestor
from toolatlas.catalog.model import ToolRecord
from toolatlas.config import Config, secrets
from toolatlas.errors import ConfigError
from toolatlas.gateway.admin import UpstreamAdmin
from toolatlas.gateway.approval import (
    ApprovalStore, Approvals, Decision, FileApprovalStore, held_reason, lifecycle, transition_reporter,
)
from toolatlas.gateway.audit import deny, who
from toolatlas.gateway.calls import CallService, Spawn
from toolatlas.gateway.catalog import LiveCatalog
from toolatlas.gateway.federation import Federation
from toolatlas.gateway.guide import Guidances, SurfaceText
from toolatlas.gateway.matches import MatchBuilder
from toolatlas.gateway.learning import LearningService
from toolatlas.gateway.ports import LOG_LEVELS, Connection, Page
from toolatlas.gateway.search import SearchService
from toolatlas.gateway.status import StatusService
from toolatlas.gateway.tokens import TokenReporter
from toolatlas.gateway.visibility import Visibility
from toolatlas.guidance import Guidance, MetaTools
from toolatlas.metrics import Metrics
from toolatlas.names import split
from toolatlas.redact import Redactor
from toolatlas.retrieval.engine import Engine
from toolatlas.rift.runner import RiftRunner
from toolatlas.upstream import children
from toolatlas.upstream.pool import Pool
from toolatlas.upstream.state import UpstreamState

log = logging.getLogger(__name__)

# How long readiness waits for the first reindex of the upstreams that connected.
FIRST_INDEX_WAIT_S = 900.0

# Keys a reload cannot apply to a running daemon: logged, applied at the next start.
RESTART_KEYS: tuple[tuple[str, str, str], ...] = (
    ("daemon.socket", "daemon", "socket"),
    ("daemon.state_dir", "daemon", "state_dir"),
    ("daemon.metrics_addr", "daemon", "metrics_addr"),
    ("search.mode", "search", "mode"),
    ("search.embedder", "search", "embedder"),
    ("search.query_threads", "search", "query_threads"),
    ("search.cache_size", "search", "cache_size"),
    ("search.cache_ttl", "search", "cache_ttl"),
    ("daemon.event_loop", "daemon", "event_loop"),
    ("events.audit_file", "events", "audit_file"),
    ("store.url", "store", "url"),
    ("store.connect_timeout", "store", "connect_timeout"),
    ("store.catchup_interval", "store", "catchup_interval"),
    ("store.retry_interval", "store", "retry_interval"),
    ("store.buffer_max_bytes", "store", "buffer_max_bytes"),
)


def open_audit(cfg: Config) -> AuditFile | None:
    """The audit file of `[events] audit_file` (None when unset); ConfigError naming the key
    when it cannot be opened."""
    if not cfg.events.audit_file:
        return None
    try:
        return AuditFile(cfg.events.audit_file, max_bytes=cfg.events.audit_max_bytes, keep=cfg.events.audit_keep)
    except OSError as exc:
        raise ConfigError(f"[events] audit_file {cfg.events.audit_file!r}: cannot open it: "
                          f"{exc.strerror or exc}") from exc


def restart_keys(old: Config, new: Config) -> list[str]:
    """The RESTART_KEYS whose value differs between `old` and `new`."""
    return [key for key, section, attr in RESTART_KEYS
            if getattr(getattr(old, section), attr) != getattr(getattr(new, section), attr)]


def keep_running(running: Config, new: Config) -> Config:
    """`new` with the RESTART_KEYS of `running` (what a reload applies): the daemon's config
    always holds what it runs with, so nothing reads a restart-only value early (the cards in
    a new state_dir) and a later reload still reports the restart it waits for."""
    kept: dict[str, dict[str, Any]] = {}
    for _key, section, attr in RESTART_KEYS:
        kept.setdefault(section, {})[attr] = getattr(getattr(running, section), attr)
    return msgspec.structs.replace(
        new, **{section: msgspec.structs.replace(getattr(new, section), **attrs) for section, attrs in kept.items()})


def make_engine(cfg: Config) -> Engine:
    return Engine(
        state_dir=Path(cfg.daemon.state_dir) / "index",
        mode=cfg.search.mode,
        embedder=cfg.search.embedder,
        cache_size=cfg.search.cache_size,
        cache_ttl=cfg.search.cache_ttl,
        query_threads=cfg.search.query_threads,
        background=True,
    )


LogListener = Callable[[str, dict[str, Any]], Awaitable[None]]


def fan_out(listeners: list[LogListener]) -> LogListener:
    """One upstream log message to every listener; one that fails does not starve the others."""

    async def each(server: str, params: dict[str, Any]) -> None:
        for listener in listeners:
            try:
                await listener(server, params)
            except Exception:
                log.exception("a log listener failed")

    return each


def upstream_observer(events: ev.Events, metrics: Metrics) -> Callable[[str, str, dict[str, Any]], None]:
    """The pool's observer: upstream lifecycle into metrics and structured events."""

    def observe(upstream: str, kind: str, fields: dict[str, Any]) -> None:
        if kind == "state":
            events.emit(ev.UPSTREAM_STATE_CHANGED, upstream=upstream, **fields)
        elif kind == "reconnect":
            metrics.count_reconnect(upstream)
        elif kind == "list_changed":
            metrics.count_list_changed(upstream)
        elif kind == "call":
            metrics.observe_upstream_call(fields["seconds"], upstream=upstream, operation=fields["operation"])

    return observe


class Gateway:
    """Everything a client connection can ask of the daemon; see the module docstring."""

    def __init__(
        self, cfg: Config, *, engine: Engine | None = None, metrics: Metrics | None = None,
        events: ev.Events | None = None, pool_mode: str = "auto", redactor: Redactor | None = None,
        approval_store: ApprovalStore | None = None,
    ) -> None:
        """`approval_store`: where approval decisions persist (default: state_dir/approvals.json);
        audit records go to `events.audit` (default: [events] audit_file)."""
        self.cfg = cfg
        self.metrics = metrics or Metrics()
        # The one source of redaction: events, status, call errors (and the log lines, when
        # the composition root hands the same one to its log formatter).
        self.redactor = redactor or (events.redactor if events is not None else Redactor())
        self.redactor.add(secrets(cfg))
        self.events = events or ev.Events(redactor=self.redactor, log_queries=cfg.daemon.log_queries,
                                          audit=open_audit(cfg))
        self.engine = engine or make_engine(cfg)
        self.catalog = LiveCatalog(self.engine, Attestor(cfg), metrics=self.metrics, events=self.events)
        self.index_ready = anyio.Event()
        self.approvals = Approvals(approval_store or FileApprovalStore(cfg.daemon.state_dir),
                                   on_transition=transition_reporter(self.events, self.metrics))
        self.approvals.reconcile(cfg)
        self.visibility = Visibility(cfg, lambda: self.catalog.view, self.index_ready.is_set, self.approvals.blocked)
        self.guidance_for = Guidances(cfg, self.visibility)  # what the model reads, per endpoint
        self.events.environment = cfg.daemon.environment
        self.definitions = MatchBuilder()  # tool definitions for `toolatlas stubs`
        self.text = SurfaceText(self.guidance_for, self.visibility, lambda: self.catalog.view,
                                lambda: [u.name for u in self.cfg.upstream], lambda: self.cfg.search.default_top_k)
        # Hear upstream log messages: (server, notifications/message params). Wired by the app.
        self.log_listeners: list[LogListener] = []
        self.pool = Pool(cfg.upstream, self._on_tools, observer=upstream_observer(self.events, self.metrics), mode=pool_mode,
                         on_lists=lambda server, kind: self.federation.changed(server, kind), on_log=fan_out(self.log_listeners))
        self.federation = Federation(self.pool, self.visibility, lambda: [u.name for u in self.cfg.upstream], self.redactor, self.events)
        self.rift = RiftRunner(self.engine)
        self.catalog.on_index_update.append(self.rift.wanted)
        self.tokens = TokenReporter(self.engine, lambda: self.catalog.view)
        held = lambda s: held_reason(s, self._lifecycle(s, "ready"))  # noqa: E731  # why an upstream serves nothing
        self.searches = SearchService(
            self.catalog, self.visibility, mode=lambda: self.cfg.search.mode, rift=lambda: self.rift.report,
            metrics=self.metrics, events=self.events, guidance=self.guidance_for,
            starting=lambda allowed: [] if self.index_ready.is_set() else self.status_service.waiting_for(allowed),
            max_top_k=lambda: self.cfg.search.default_top_k, held=held,
            unsearchable=lambda server: self.status_service.unsearchable(server),
        )
        self.status_service = StatusService(
            self.catalog, self.visibility, self.pool, self.tokens, self.rift, index_ready=self.index_ready.is_set,
            redactor=self.redactor, environment=lambda conn: self.guidance_for(conn).environment,
            meta_tools=self.meta_tools, approval=self._lifecycle,
        )
        self.calls = CallService(
            self.catalog, self.visibility, self.pool.call_tool, self.status_service.unavailable_reason,
            metrics=self.metrics, events=self.events, redactor=self.redactor,
            not_listed=self.status_service.not_listed,
            asks_mid_call=lambda s: (st := self.pool.get(s)) is not None and st.handshake, spawn=self._spawner,
            session_ready=lambda s: (st := self.pool.get(s)) is not None and st.state is UpstreamState.READY,
            held=held,
        )
        self.learning = LearningService(lambda: self.cfg.learning, self.engine, Path(cfg.daemon.state_dir), metrics=self.metrics)
        self.searches.on_answer = lambda conn, query, names: self.learning.searched(conn, query, names, self.engine.version)
        self.calls.on_done = self.learning.executed
        self.status_service.sections["learning"] = self.learning.status
        self.admin = UpstreamAdmin(self.pool, self.catalog, lambda: self.cfg.upstream, redactor=self.redactor,
                                   events=self.events, metrics=self.metrics,
                                   approval=self._lifecycle)
        self._tg: anyio.abc.TaskGroup | None = None
        self.metrics.set_state_source(self.status_service.snapshot)

    def __repr__(self) -> str:
        view = self.catalog.view
        return f"<Gateway tools={len(view.by_name)} available={sorted(view.available)} ready={self.index_ready.is_set()}>"

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect upstreams, load the persisted index, bring the embedding model in behind
        them, and set `index_ready` once the upstreams that connected have their first listing
        indexed (BM25 at least: the model never holds it up). started() at once: search
        answers degraded until the index is loaded."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            tg.start_soon(self.catalog.export_ahead)  # a fresh state_dir's export, niced, beside everything
            await tg.start(self.pool.run)  # first: upstreams start while the index loads
            await self.catalog.load(frozenset(u.name for u in self.cfg.upstream))
            await tg.start(self.learning.run)
            tg.start_soon(self.catalog.run_model, self.index_ready)  # the model's worker, once search serves
            tg.start_soon(self.catalog.run_card_rechecks, lambda: self.cfg.cards.recheck_interval)
            tg.start_soon(self.rift.run)
            await self.pool.wait_settled(max((u.timeouts.connect for u in self.cfg.upstream), default=1.0) + 5)
            # Every upstream has started: a child the CLI spawned early that none took is stopped.
            await anyio.to_thread.run_sync(children.discard)
            # Ready upstreams have listed; their first reindex (embedding a new catalog can take
            # minutes on a small host) must land before the index counts as ready.
            with anyio.move_on_after(FIRST_INDEX_WAIT_S):
                while not self._ready_upstreams() <= self.catalog.view.available:
                    await anyio.sleep(0.02)
            self.index_ready.set()
            view = self.catalog.view
            log.info("index ready: %d tools from %d upstreams (search: %s)", len(view.by_name), len(view.available),
                     self.engine.degraded or "hybrid" if self.cfg.search.embedder != "none" else "bm25")
            await self.catalog.announce()

    def _spawner(self) -> Spawn | None:
        tg = self._tg
        return None if tg is None else tg.start_soon

    async def _on_tools(self, server: str, tools: list[ToolRecord] | None) -> None:
        await self.catalog.on_tools(server, tools)
        await self.federation.session_changed(server, tools is not None)

    def _lifecycle(self, name: str, state: str) -> str:
        return lifecycle(self.approvals.decision(name), state)

    def _ready_upstreams(self) -> set[str]:
        return {st.name for st in self.pool.status() if st.state is UpstreamState.READY}

    async def decide_approval(self, name: str, decision: Decision, by: str) -> dict[str, Any]:
        """An operator's approve/reject (see gateway.approval); clients whose lists change are told."""
        result = self.approvals.decide(name, decision, by)
        if result["approval"] != result["previous"]:
            self.calls.withdraw(f"the operator {result['approval']} upstream {name!r}", hold=True)  # a reject ends its calls
            await self.catalog.announce()
            await self.federation.reloaded()
        return result

    async def drain(self, timeout: float) -> None:
        """Refuse new calls and let those in flight finish (bounded)."""
        self.calls.draining = True
        await self.calls.wait_idle(timeout)
        if self.calls.inflight:
            log.warning("shutting down with %d calls still in flight after %.1f s", self.calls.inflight, timeout)

    def close_audit(self) -> None:
        """Sync and close the audit sinks (the daemon is stopping)."""
        for sink in (self.events.audit, self.events.shared_audit):
            if sink is not None:
                sink.close()

    async def close_upstreams(self, timeout: float = 20.0) -> None:
        """Stop every upstream session in its owner task (children reaped) before the tree's cancel."""
        with anyio.move_on_after(timeout, shield=True):
            await self.pool.reconcile([], why="daemon stop")

    async def reload(self, new: Config, attestor: Attestor, guidance: Guidance | None = None) -> dict[str, list[str]]:
        """Apply a re-read config (its [cards] already checked into `attestor`, its templates
        into `guidance`, else loaded here first, ConfigError before anything changes):
        upstreams added, removed or changed are reconciled; the unchanged keep their warm
        session, index entries and card verdicts. `new` holds the running values of restart-only
        keys (`keep_running`, by the caller). New templates or environment reach clients with the announce."""
        self.guidance_for.configure(new, guidance)
        old = self.cfg
        old_ups = {u.name: u for u in old.upstream}
        new_ups = {u.name: u for u in new.upstream}
        summary = {
            "added": sorted(set(new_ups) - set(old_ups)),
            "removed": sorted(set(old_ups) - set(new_ups)),
            "changed": sorted(n for n in set(old_ups) & set(new_ups) if old_ups[n] != new_ups[n]),
        }
        self.cfg = new
        self.approvals.reconcile(new)
        self.visibility.configure(new)
        self.calls.withdraw("the daemon's access rules changed")  # calls in flight the new rules no longer allow end now
        self.learning.reconfigured()
        cards_changed = self.catalog.reconfigure(attestor)
        self.redactor.add(secrets(new))  # removed ones stay: late lines may still quote them
        self.events.log_queries, self.events.environment = new.daemon.log_queries, new.daemon.environment
        if isinstance(self.events.audit, AuditFile):
            self.events.audit.max_bytes, self.events.audit.keep = new.events.audit_max_bytes, new.events.audit_keep
        await self.pool.reconcile(new.upstream)
        for name in summary["removed"]:
            await self._on_tools(name, None)
            await self.catalog.drop(name)
            self.metrics.forget_upstream(name)
        if cards_changed:  # every verdict was made under the old [cards] settings
            await self.catalog.recheck(sorted(self.catalog.view.available))
        log.info("reload: +%s -%s ~%s", summary["added"], summary["removed"], summary["changed"])
        await self.catalog.announce()
        await self.federation.reloaded()
        return summary

    @property
    def default_top_k(self) -> int:
        return self.cfg.search.default_top_k

    @property
    def starting(self) -> bool:
        return not self.index_ready.is_set()

    def instructions(self, conn: Connection | None) -> str:
        return self.text.instructions(conn)

    def meta_tools(self, conn: Connection) -> MetaTools:
        return self.text.meta_tools(conn)

    def passthrough_for(self, conn: Connection) -> bool:
        return self.visibility.passthrough_for(conn)

    def visible_records(self, conn: Connection) -> list[ToolRecord]:
        return self.visibility.visible_records(conn)

    def tools_listed(self, conn: Connection, *, passthrough: bool, tools: int) -> None:
        if passthrough and not self.index_ready.is_set():
            self.metrics.count_fallback("passthrough")
        self.metrics.count_endpoint_request(conn.endpoint, "tools_list")
        self.events.emit(ev.TOOLS_LIST_SERVED, passthrough=passthrough, tools=tools, **who(conn))

    def bad_message(self) -> None:
        self.metrics.count_error("bad_client_message")

    def denied(self, conn: Connection, surface: str, target: str | None, reason: str) -> None:
        deny(self.events, self.metrics, conn, surface, target, reason)

    async def search(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any]:
        return await self.searches.search(query, top_k, servers, conn)

    def search_cached(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any] | None:
        return self.searches.cached(query, top_k, servers, conn)

    async def execute(self, call: CallRequest, conn: Connection) -> CallOutcome:
        outcome = await self.calls.execute(call, conn)
        if outcome.resource_uris and (parsed := split(call.name)):
            self.federation.remember(parsed[0], outcome.resource_uris)
        return outcome

    def status(self, conn: Connection) -> Mapping[str, Any]:
        return self.status_service.status(conn, self._tg if self.index_ready.is_set() else None)

    def tool_definitions(self, conn: Connection, servers: list[str] | None) -> list[dict[str, Any]]:
        allowed = self.visibility.allowed_servers(conn)
        if servers is not None:
            # BadInput naming a server it may not use
            self.visibility.search_scope(servers, allowed, self.searches.held_for(servers, allowed, conn))
        return self.definitions.definitions(self.catalog.view, set(servers) & allowed if servers is not None else allowed)

    def may_use(self, conn: Connection, server: str) -> bool:
        return server in self.visibility.allowed_servers(conn)

    async def listing(self, kind: str, conn: Connection, cursor: str | None) -> Page:
        return await self.federation.page(kind, conn, cursor)

    async def read_resource(self, uri: str, conn: Connection) -> dict[str, Any]:
        return await self.federation.read(uri, conn)

    async def get_prompt(self, name: str, arguments: dict[str, str] | None, conn: Connection) -> dict[str, Any]:
        return await self.federation.get_prompt(name, arguments, conn)

    async def set_log_level(self, level: str) -> None:
        await self.pool.raise_log_level(level, LOG_LEVELS)


__all__ = ["FIRST_INDEX_WAIT_S", "Gateway", "keep_running", "make_engine", "restart_keys"]
