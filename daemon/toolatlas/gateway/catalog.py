"""`LiveCatalog`: the one owner of catalog state.

Every change goes the same way: a pure plan from `view.py` (old view + what happened; a
listing's plan is computed in a worker thread), the index I/O in a worker thread (inserts before deletes; the engine swaps its snapshot
atomically), and the new `CatalogView` published by one assignment. Changes are serialised
by one lock, so a card re-check can never apply an older listing over a newer one. Readers
take `catalog.view` once and use that value; nothing else holds a copy of the catalog.

The index serves BM25 from the first listing on; `run_model` brings the dense branch in
behind it (the model exported and loaded, documents embedded in a worker thread, the hybrid
snapshot published by the engine), so nothing waits on the model (retrieval/warmup.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio

from toolatlas import events as ev
from toolatlas import memory
from toolatlas.catalog.attest import Attestor
from toolatlas.catalog.model import ToolRecord
from toolatlas.gateway.view import CatalogView, Plan, plan_down, plan_drop, plan_listing, plan_restored
from toolatlas.metrics import Metrics
from toolatlas.retrieval.engine import Engine, ToolDoc

log = logging.getLogger(__name__)

ChangeListener = Callable[[], Awaitable[None]]


class LiveCatalog:
    """The live catalog of every upstream; see the module docstring."""

    def __init__(self, engine: Engine, attestor: Attestor, *, metrics: Metrics, events: ev.Events) -> None:
        self.engine = engine
        self.attestor = attestor
        self.view = CatalogView()
        self.engine_loaded = anyio.Event()
        self._metrics = metrics
        self._events = events
        self._lock = anyio.Lock()
        self._embeddings_seen = 0
        self._dense_wanted = anyio.Event()  # set when an update leaves documents to embed
        self._reloaded = anyio.Event()  # set by a reload: card re-checks read their interval again
        # Called after every visible change (clients re-list); and after every index update.
        self.on_change: list[ChangeListener] = []
        self.on_index_update: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"<LiveCatalog tools={len(self.view.by_name)} available={sorted(self.view.available)}>"

    # -- lifecycle --------------------------------------------------------------------------

    async def load(self, configured: frozenset[str]) -> None:
        """Load the index snapshot from disk (no model needed) and adopt what it holds (see
        `plan_restored`); servers no longer configured are removed from the index now."""
        await anyio.to_thread.run_sync(self.engine.restore)
        _version, docs, _vecs = self.engine.catalog_vectors()
        async with self._lock:
            view, gone = plan_restored(self.view, docs, configured)
            self.view = view
            if gone:
                await anyio.to_thread.run_sync(self._index, (), gone)
                log.info("dropped %d indexed tools of upstreams no longer configured", len(gone))
        if docs and not gone:
            self._index_updated()  # analyse the restored catalog (no update may follow)
        self.engine_loaded.set()

    async def export_ahead(self) -> None:
        """On a fresh state_dir, the ONNX export (a torch subprocess, tens of CPU seconds)
        starts at spawn: niced, it takes the cores only where the upstreams' start and the
        first index leave them idle, and dense search does not wait for the first index to
        start it (issue 16: hybrid no later than when the export ran before everything)."""
        try:
            await anyio.to_thread.run_sync(self.engine.export_ahead, abandon_on_cancel=True)
        except BaseException:
            self.engine.cancel()  # shutting down: the exporter is killed, no child outlives us
            raise

    async def run_model(self, serving: anyio.Event) -> None:
        """Bring the index from BM25 to hybrid in the background once `serving` is set (search
        serves: loading the model and embedding every document would otherwise take the cores
        from the start that the first answer waits for), and keep it there: load the model
        (exporting it first on a fresh state_dir), then embed what the index lacks, a batch
        per worker-thread call, until the engine publishes the hybrid snapshot; wait for the
        next update that leaves documents to embed. With an embedding cache shared with other
        replicas ([store]) the model loads at once, beside the upstreams' start: the
        documents' vectors come from the store, so after the first index a second replica
        waits only for their fetch and the HNSW build. Runs until cancelled; a shutdown kills
        a running export (no child outlives the daemon) and abandons a batch in flight."""
        engine = self.engine
        try:
            if engine.shares_vectors:
                await anyio.to_thread.run_sync(engine.load_model, abandon_on_cancel=True)
            await serving.wait()
            if await anyio.to_thread.run_sync(engine.load_model, abandon_on_cancel=True) is None:
                return  # embedder "none", or it failed: BM25 only (logged, in catalog_status)
            while True:
                wanted = self._dense_wanted = anyio.Event()
                while await anyio.to_thread.run_sync(engine.embed_pending, abandon_on_cancel=True):
                    self._count_embeddings()
                self._count_embeddings()
                self._index_updated()  # Rift and tokens read the hybrid snapshot
                await wanted.wait()
        finally:
            engine.cancel()

    def _count_embeddings(self) -> None:
        computed = int(self.engine.stats().get("embeddings_computed", 0))
        if computed > self._embeddings_seen:
            self._metrics.count_embeddings(computed - self._embeddings_seen)
        self._embeddings_seen = computed

    def reconfigure(self, attestor: Attestor) -> bool:
        """A reload's new card settings. Verdicts stay in the view, so re-checks go on for
        every upstream; the new Attestor re-reads each card file on its first re-check.
        True when the settings a verdict depends on changed (the trusted key, required,
        policy): the caller then re-attests every upstream (`recheck`), because re-checks
        look only at card files that changed, and run not at all with recheck_interval 0,
        so a card signed by a key no longer trusted would go on being served."""
        changed = attestor.settings != self.attestor.settings
        self.attestor = attestor
        self._reloaded.set()
        return changed

    # -- changes ----------------------------------------------------------------------------

    async def on_tools(self, server: str, tools: list[ToolRecord] | None) -> None:
        """The pool's callback: `server` listed `tools`, or went down (None)."""
        if tools is None:
            async with self._lock:
                plan = plan_down(self.view, server)
                self.view = plan.final
            if plan.became_unavailable:
                log.info("upstream %s is down: its %d tools leave search", server,
                         len(plan.final.server(server).records))
                entry = plan.final.server(server)
                self._events.emit(ev.CATALOG_CHANGED, server=server, available=False, tools=0, upserted=0,
                                  removed=0, quarantined=len(entry.quarantined),
                                  card=entry.verdict.card_status if entry.verdict else None)
                await self.announce()
            return
        await self.engine_loaded.wait()
        await self._apply(server, tools, from_listing=True)

    async def recheck(self, servers: Sequence[str]) -> None:
        """Re-attest `servers` (their card file changed) against their last listing."""
        for server in servers:
            entry = self.view.server(server)
            if entry.available and entry.listing is not None:
                await self._apply(server, entry.listing, from_listing=False)

    async def drop(self, server: str) -> None:
        """Forget every tool of a server that left the config."""
        async with self._lock:
            plan = plan_drop(self.view, server)
            self.view = plan.interim
            if plan.removes:
                await anyio.to_thread.run_sync(self._index, (), plan.removes)
            self.view = plan.final

    async def _apply(self, server: str, listing: Sequence[ToolRecord], *, from_listing: bool) -> None:
        async with self._lock:
            current = self.view.server(server)
            if not from_listing:
                if not current.available or current.listing is None:
                    return
                listing = current.listing  # the newest listing, read under the lock
            verdict = await anyio.to_thread.run_sync(self.attestor.attest, server, list(listing))
            available = True if from_listing else current.available
            # Pure, but over 20,000 tools it takes a good part of a second: a worker thread.
            plan = await anyio.to_thread.run_sync(
                lambda: plan_listing(self.view, server, listing, verdict, available=available))
            await self._execute(plan)
        if from_listing:
            _log_repairs(server, listing, {d.name for d in plan.upserts})
        if plan.visible_change:
            entry = plan.final.server(server)
            self._events.emit(
                ev.CATALOG_CHANGED, server=server, available=True, tools=len(entry.records),
                upserted=len(plan.upserts), removed=len(plan.removes), quarantined=len(entry.quarantined),
                card=verdict.card_status,
            )
            await self.announce()

    async def _execute(self, plan: Plan) -> None:
        """Publish `plan`: new records callable first, the index swapped, then the rest."""
        self.view = plan.interim
        if plan.index_changed:
            version = await anyio.to_thread.run_sync(self._index, plan.upserts, plan.removes)
            log.info("catalog of %s changed: %d upserted, %d removed (index version %d)",
                     plan.server, len(plan.upserts), len(plan.removes), version)
        self.view = plan.final

    def _index(self, upserts: Sequence[ToolDoc], removes: Sequence[str]) -> int:
        """Runs in a worker thread: update the index and count what it cost."""
        version = self.engine.update(list(upserts), list(removes))
        anyio.from_thread.run_sync(self._index_updated)
        if self.engine.progress.pending:
            anyio.from_thread.run_sync(self._dense_wanted.set)  # the model's worker embeds them
        self._metrics.count_reindex()
        self._count_embeddings()
        memory.settle_heap()
        return version

    def _index_updated(self) -> None:
        for hook in self.on_index_update:
            hook()

    async def announce(self) -> None:
        """Tell the change listeners (the surface: clients re-list) that lists may differ."""
        for listener in self.on_change:
            await listener()

    # -- card re-checks ---------------------------------------------------------------------

    async def run_card_rechecks(self, interval: Callable[[], float]) -> None:
        """Re-attest connected upstreams whose card file changed: card files change without
        the upstream's catalog changing (tampering, re-signing after a quarantine). Only
        those: re-applying every upstream's catalog each interval would block the event
        loop for a time that grows with the catalog. `interval()` is read each round and at
        a reload (not only once the old interval ran out), so a reload's value takes effect at
        once; 0 turns re-checks off."""
        while True:
            seconds = interval()
            with anyio.move_on_after(seconds if seconds > 0 else 60):
                await self._reloaded.wait()
            if self._reloaded.is_set():
                self._reloaded = anyio.Event()
                continue
            if seconds <= 0:
                continue
            view = self.view
            attested = [n for n, s in view.servers.items() if s.verdict is not None and s.available]
            changed = await anyio.to_thread.run_sync(self.attestor.changed_servers, attested)
            await self.recheck(changed)




def _log_repairs(server: str, listing: Sequence[ToolRecord], changed: set[str]) -> None:
    """One warning per tool changed at ingest (cut to a bound, or its schema repaired), when it
    enters the index or changes: not at every poll."""
    for rec in listing:
        if rec.problems and rec.name in changed:
            log.warning("upstream %s: tool %r was changed at ingest and stays usable: %s", server, rec.tool,
                        "; ".join(rec.problems))


__all__ = ["LiveCatalog"]
