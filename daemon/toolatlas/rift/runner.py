"""Rift in the daemon: re-analyse the indexed catalog once changes settle (debounced), in a
worker thread, reusing the index's vectors. tool_search notes and catalog_status read the
latest report; an analysis failure never affects serving."""

from __future__ import annotations

import logging

import anyio

from toolatlas import memory
from toolatlas.retrieval.engine import Engine
from toolatlas.rift.inputs import build_inputs
from toolatlas.rift.report import RiftReport, analyse

log = logging.getLogger(__name__)

# Quiet seconds after a catalog change before Rift re-analyses it.
RIFT_DEBOUNCE_S = 1.0
# ... but no later than this after the first change it has not analysed: an upstream that
# changes its tools more often than the debounce time would otherwise hold Rift off for as
# long as it keeps changing (the report, its notes and catalog_status frozen meanwhile).
RIFT_MAX_DELAY_S = 10.0
# Largest catalog the daemon runs Rift on (an n x n float32 matrix: 5,000 tools ~ 100 MB).
RIFT_MAX_TOOLS = 5000


class RiftRunner:
    """Holds the latest `RiftReport` (or why there is none); `wanted()` asks for a run."""

    def __init__(self, engine: Engine, *, debounce: float = RIFT_DEBOUNCE_S, max_delay: float = RIFT_MAX_DELAY_S,
                 max_tools: int = RIFT_MAX_TOOLS) -> None:
        self._engine = engine
        self._debounce = debounce
        self._max_delay = max_delay
        self._max_tools = max_tools
        self.report: RiftReport | None = None
        self.version: int | None = None  # the index version the last analysis (or refusal) read
        self.skipped = 0  # requests for an index already analysed
        self.error: str | None = None
        self._wanted = anyio.Event()

    def wanted(self) -> None:
        """The catalog changed: analyse it once it has been quiet for the debounce time."""
        self._wanted.set()

    async def run(self) -> None:
        while True:
            await self._wanted.wait()
            with anyio.move_on_after(self._max_delay):
                while True:  # debounce: wait for a quiet spell (at most max_delay)
                    self._wanted = anyio.Event()
                    with anyio.move_on_after(self._debounce):
                        await self._wanted.wait()
                        continue
                    break
            if self.report is not None and self.error is None and self.version == self._engine.version:
                self.skipped += 1  # this index is analysed already (one change can ask twice: its update, its vectors)
                continue
            try:
                self.error = None
                self.report, self.version = await anyio.to_thread.run_sync(self._analyse)
            except Exception as exc:  # an analysis failure must never affect serving
                log.warning("rift analysis failed: %s", exc)
                self.error = str(exc)

    def _analyse(self) -> tuple[RiftReport | None, int]:
        """(the report, or None, and the index version it read)."""
        embedder = self._engine.embedder
        version, docs, vecs = self._engine.catalog_vectors()
        if embedder is None or vecs is None or not docs:
            return None, version
        if len(docs) > self._max_tools:
            # Clustering holds an n x n similarity matrix: past this size it belongs in an
            # offline `toolatlas rift` run, not in the daemon's memory.
            self.error = (f"catalog has {len(docs)} tools, above the {self._max_tools} the daemon "
                          "analyses; run `toolatlas rift --config PATH` offline")
            return None, version
        tools, schemas, token_texts = build_inputs([(d, d.description, d.server_summary, d.tags) for d in docs])
        report = analyse(tools, embedder, schemas=schemas, token_texts=token_texts, vectors=vecs)
        memory.settle_heap()  # the analysis held n x n similarities; its report stays
        memory.trim_heap()  # ... and their pages go back to the OS
        log.info("rift: %d clusters over %d tools (index version %d): %s",
                 len(report.clusters), len(docs), version, report.counts())
        return report, version


__all__ = ["RIFT_DEBOUNCE_S", "RIFT_MAX_DELAY_S", "RIFT_MAX_TOOLS", "RiftRunner"]
