"""The daemon: one task tree owning the upstream pool, the live catalog, the index and the socket.

The Gateway is what the MCP surface calls: `search`, `execute`, `status`, the listings. The
catalog is kept per upstream and diffed by content hash on every tools/list; the engine is
updated in a worker thread (inserts before deletes, atomic snapshot swap), so a search never
sees a half-built index. Tools of an upstream that is not READY stay indexed but are scoped
out of every search and refused for calls until it recovers.
"""

from __future__ import annotations

import difflib
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types

from toolatlas.catalog.model import ToolRecord, diff
from toolatlas.config import Config
from toolatlas.errors import BadInput, UpstreamUnavailable
from toolatlas.names import split
from toolatlas.retrieval.engine import Engine, ToolDoc
from toolatlas.surface.server import Connection, build_server
from toolatlas.surface.unix import UnixServer
from toolatlas.upstream.pool import Pool
from toolatlas.upstream.state import UpstreamState

log = logging.getLogger(__name__)

# How long tool_search waits for a first index before answering degraded.
INDEX_WAIT_S = 10.0

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]


def record_from_tool(server: str, tool: types.Tool) -> ToolRecord:
    return ToolRecord.make(
        server,
        tool.name,
        tool.description,
        tool.input_schema,
        title=tool.title,
        output_schema=tool.output_schema,
    )


def doc_from_record(rec: ToolRecord) -> ToolDoc:
    return ToolDoc(
        name=rec.name,
        server=rec.server,
        tool=rec.tool,
        description=rec.description,
        input_schema=rec.input_schema,
    )


class Gateway:
    """Everything a client connection can ask of the daemon."""

    def __init__(self, cfg: Config, *, engine: Engine | None = None) -> None:
        self.cfg = cfg
        self.records: dict[str, dict[str, ToolRecord]] = {}
        self.by_name: dict[str, ToolRecord] = {}
        self.available: set[str] = set()
        state_dir = Path(cfg.daemon.state_dir)
        self.engine = engine or Engine(
            state_dir=state_dir / "index",
            mode=cfg.search.mode,
            embedder=cfg.search.embedder,
            cache_size=cfg.search.cache_size,
            cache_ttl=cfg.search.cache_ttl,
        )
        self.pool = Pool(cfg.upstream, self._on_tools)
        self.server = build_server(self)
        self.unix = UnixServer(
            self.server,
            cfg.daemon.socket,
            mode=int(cfg.daemon.socket_mode, 8),
            owner=cfg.daemon.socket_owner,
            group=cfg.daemon.socket_group,
            max_message_bytes=cfg.daemon.max_message_bytes,
        )
        self.engine_loaded = anyio.Event()
        self.index_ready = anyio.Event()
        self.inflight = 0
        self.draining = False
        self._update_lock = anyio.Lock()
        self._idle = anyio.Event()
        self._idle.set()
        self._scope = frozenset(cfg.search.scope) or None
        self.started_at = time.time()

    def __repr__(self) -> str:
        return f"<Gateway tools={len(self.by_name)} available={sorted(self.available)} ready={self.index_ready.is_set()}>"

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen, load the index, connect upstreams; started() once the socket listens."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.unix.run)
            task_status.started()
            await anyio.to_thread.run_sync(self.engine.load)
            self.engine_loaded.set()
            await tg.start(self.pool.run)
            await self.pool.wait_settled(max((u.timeouts.connect for u in self.cfg.upstream), default=1.0) + 5)
            # Ready upstreams have listed; give their first reindex (already running) time to land.
            with anyio.move_on_after(60):
                while not self._ready_upstreams() <= self.available:
                    await anyio.sleep(0.02)
            self.index_ready.set()
            log.info("index ready: %d tools from %d upstreams", len(self.by_name), len(self.available))
            await self._notify_list_changed()

    async def close_upstreams(self, timeout: float = 20.0) -> None:
        """Stop every upstream session in its owner task (children reaped) before the
        task tree is cancelled."""
        with anyio.move_on_after(timeout, shield=True):
            await self.pool.reconcile([])

    def _ready_upstreams(self) -> set[str]:
        return {st.name for st in self.pool.status() if st.state is UpstreamState.READY}

    async def drain(self, timeout: float) -> None:
        """Stop accepting connections and let in-flight calls finish (bounded)."""
        self.draining = True
        await self.unix.stop_accepting()
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        if self.inflight:
            log.warning("shutting down with %d calls still in flight after %.1f s", self.inflight, timeout)

    # -- catalog ---------------------------------------------------------------------------

    async def _on_tools(self, server: str, tools: list[types.Tool] | None) -> None:
        if tools is None:
            if server in self.available:
                self.available.discard(server)
                log.info("upstream %s is down: its %d tools leave search", server, len(self.records.get(server, {})))
                await self._notify_list_changed()
            return
        await self.engine_loaded.wait()
        new = {}
        for tool in tools:
            rec = record_from_tool(server, tool)
            new[rec.name] = rec
        old = self.records.get(server, {})
        d = diff(old, new)
        if not d.empty:
            upserts = [doc_from_record(r) for r in (*d.added, *d.changed)]
            async with self._update_lock:
                # Insert before delete: new records become callable first, the index swaps
                # atomically, and only then do removed names disappear.
                for r in (*d.added, *d.changed):
                    self.by_name[r.name] = r
                self.records[server] = new
                version = await anyio.to_thread.run_sync(self.engine.update, upserts, d.removed)
                for name in d.removed:
                    self.by_name.pop(name, None)
            log.info(
                "catalog of %s changed: +%d ~%d -%d (index version %d)",
                server, len(d.added), len(d.changed), len(d.removed), version,
            )
        was_available = server in self.available
        self.available.add(server)
        if not d.empty or not was_available:
            await self._notify_list_changed()

    async def _notify_list_changed(self) -> None:
        """Tell clients whose tools/list would now differ (passthrough views) to re-list."""
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
        """Servers this connection may use (static scope for now; per-user rules come later)."""
        names = set(self.records) | {u.name for u in self.cfg.upstream}
        return names & self._scope if self._scope else names

    def passthrough_for(self, conn: Connection) -> bool:
        if not self.index_ready.is_set():
            return True
        return bool(conn.client_name) and conn.client_name in self.cfg.daemon.passthrough_clients

    def visible_records(self, conn: Connection) -> list[ToolRecord]:
        usable = self.allowed_servers(conn) & self.available
        return sorted((r for r in self.by_name.values() if r.server in usable), key=lambda r: r.name)

    def events_emit(self, event: str, **fields: Any) -> None:
        log.debug("%s %s", event, fields)

    # -- meta-tools ----------------------------------------------------------------------------

    async def search(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any]:
        allowed = self.allowed_servers(conn)
        if servers is not None:
            unknown = sorted(set(servers) - allowed)
            if unknown:
                raise BadInput(
                    f"unknown server(s) {', '.join(unknown)}; servers you can search: {', '.join(sorted(allowed)) or 'none'}"
                )
            allowed &= set(servers)
        scope = allowed & self.available
        degraded: str | None = None
        matches: list[dict[str, Any]] = []
        if not self.engine_loaded.is_set():
            with anyio.move_on_after(INDEX_WAIT_S):
                await self.engine_loaded.wait()
        if not self.engine_loaded.is_set():
            degraded = "index-not-ready"
        elif scope:
            outcome = await anyio.to_thread.run_sync(
                lambda: self.engine.search(query, top_k, servers=frozenset(scope))
            )
            degraded = outcome.degraded
            for hit in outcome.hits:
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
        return {"query": query, "matches": matches[:top_k], "degraded": degraded}

    async def execute(
        self, name: str, arguments: Any, conn: Connection, progress: ProgressFn | None = None
    ) -> types.CallToolResult:
        if self.draining:
            raise UpstreamUnavailable("the gateway is shutting down; retry in a moment")
        rec = self.by_name.get(name)
        allowed = self.allowed_servers(conn)
        if rec is None or rec.server not in allowed:
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
        if self.inflight == 0:
            self._idle = anyio.Event()
        self.inflight += 1
        try:
            return await self.pool.call_tool(rec.server, rec.tool, arguments, progress_callback=progress)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    def _unknown_tool_message(self, name: str, allowed: set[str]) -> str:
        candidates = [n for n, r in self.by_name.items() if r.server in allowed]
        close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
        parsed = split(name)
        if not close and parsed:
            close = difflib.get_close_matches(parsed[1], [self.by_name[n].tool for n in candidates], n=3, cutoff=0.6)
            close = [n for n in candidates if self.by_name[n].tool in close][:3]
        hint = f" Did you mean: {', '.join(close)}?" if close else " Use tool_search to find tools."
        return f"unknown tool {name!r}.{hint}"

    def status(self, conn: Connection) -> dict[str, Any]:
        allowed = self.allowed_servers(conn)
        servers = []
        for st in self.pool.status():
            if st.name not in allowed:
                continue
            servers.append(
                {
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
            )
        stats = self.engine.stats()
        return {
            "servers": servers,
            "tools": sum(1 for r in self.by_name.values() if r.server in allowed and r.server in self.available),
            "index": {"ready": self.index_ready.is_set(), **stats},
            "index_version": stats.get("version"),
            "uptime_s": round(time.time() - self.started_at, 1),
        }


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


async def serve(cfg: Config, *, ready: Callable[[Gateway], None] | None = None) -> None:
    """Run the daemon until SIGTERM/SIGINT; then drain and close every upstream."""
    gw = Gateway(cfg)
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            await tg.start(gw.run)
            if ready is not None:
                ready(gw)
            async for signum in signals:
                log.info("received %s: draining for up to %.0f s", signal.Signals(signum).name, cfg.daemon.drain_timeout)
                break
        await gw.drain(cfg.daemon.drain_timeout)
        await gw.close_upstreams()
        tg.cancel_scope.cancel()
    log.info("stopped")


def main_serve(cfg: Config) -> int:
    _configure_logging(cfg.daemon.log_level)
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
