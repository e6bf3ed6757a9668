"""Where the dense branch of an engine stands: the model's phase and the embedding progress.

A fresh `state_dir` has no ONNX export: the model is exported (a subprocess, tens of seconds
on a small host), loaded, and every document embedded before dense search can join. The
engine serves BM25 meanwhile and reports this record, so `catalog_status`, `toolatlas status`
and `tool_search`'s `degraded` say what it is waiting for. Immutable: the engine replaces it
whole (one assignment), and readers in other threads take it once.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolatlas.retrieval.embed import Embedder
    from toolatlas.retrieval.index import IndexBuilder

log = logging.getLogger(__name__)

# Documents per background step: a shutdown waits for the step in flight (about a second on
# two cores), and progress moves at least this often.
STEP_BATCH = 64
# Documents per step looked up in a shared embedding cache (toolatlas.store) before embedding:
# a second replica's 2,000-tool catalog in one round trip (~6 MB of vectors).
SHARED_BATCH = 4096


class ModelPhase(enum.Enum):
    OFF = "off"  # embedder = "none": BM25 only, by configuration
    WAITING = "waiting"  # not started yet
    EXPORTING = "exporting"  # the one-time ONNX export (fresh state_dir)
    LOADING = "loading"  # the model files into onnxruntime (or torch)
    EMBEDDING = "embedding"  # documents without a vector are being embedded in the background
    READY = "ready"  # every indexed document is in the dense index: hybrid search
    FAILED = "failed"  # the model could not be loaded or run: BM25 only, with the reason


# What tool_search's `degraded` says while the dense branch is not there yet (interface).
LOADING = "embedding model loading"
# ... while a large catalog change is embedded in the background after the model was ready.
EMBEDDING_NEW = "embedding new tools"
FAILED = "bm25-only"


@dataclass(frozen=True)
class ModelProgress:
    phase: ModelPhase
    since: float = dataclasses.field(default_factory=time.monotonic)  # when this phase began
    embedded: int = 0  # indexed documents that have a vector
    total: int = 0  # indexed documents
    hybrid_once: bool = False  # a hybrid snapshot was published since the process started
    error: str | None = None

    def to(self, phase: ModelPhase, **changes: Any) -> ModelProgress:
        """This record in `phase` (its clock restarted when the phase changes)."""
        since = self.since if phase is self.phase else time.monotonic()
        return dataclasses.replace(self, phase=phase, since=since, **changes)

    @property
    def pending(self) -> bool:
        """The model is still to load, or documents to embed (the background worker's work)."""
        return self.phase in (ModelPhase.WAITING, ModelPhase.EXPORTING, ModelPhase.LOADING, ModelPhase.EMBEDDING)

    @property
    def degraded(self) -> str | None:
        """Why dense search is missing, or None when nothing is missing."""
        if self.phase in (ModelPhase.OFF, ModelPhase.READY):
            return None
        if self.phase is ModelPhase.FAILED:
            return FAILED
        return EMBEDDING_NEW if self.hybrid_once else LOADING

    def describe(self, counts: bool = True) -> str:
        """One line for people: "embedding model: exporting (12 s)"; `counts` False leaves
        out how many documents of the whole catalog are embedded."""
        secs = f"{time.monotonic() - self.since:.0f} s"
        if self.phase is ModelPhase.EMBEDDING:
            done = f", {self.embedded} of {self.total} done" if counts else ""
            return f"embedding model: embedding documents{done} ({secs})"
        if self.phase is ModelPhase.FAILED:
            return f"embedding model: failed ({self.error}); searching BM25 only"
        if self.phase is ModelPhase.WAITING:
            return f"embedding model: waiting to start ({secs})"
        return f"embedding model: {self.phase.value} ({secs})"

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.phase.value, "seconds": round(time.monotonic() - self.since, 1),
                "embedded": self.embedded, "total": self.total, "error": self.error}


class ModelLoader:
    """One engine's embedding model: loading it (the ONNX export first when state_dir has
    none), its failure, and the progress record. Thread-safe; `load` is idempotent."""

    def __init__(self, kind: str, state_dir: Path | None, query_threads: int, counts: dict[str, int]) -> None:
        self.kind = kind
        self.state_dir = state_dir
        self.query_threads = query_threads
        self.model: Embedder | None = None  # loaded (perhaps not yet serving queries)
        self.progress = ModelProgress(ModelPhase.OFF if kind == "none" else ModelPhase.WAITING)
        self.seconds = 0.0  # what the load took
        self._counts = counts
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._export_error: Exception | None = None  # from export_ahead

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Kill a running export; the engine's worker starts no further batch."""
        self._cancel.set()

    def export_ahead(self) -> None:
        """Make the one-time ONNX export now, without loading the model: the daemon starts it
        at spawn, beside the upstreams (the exporter runs niced, so their start and the first
        BM25 answers keep the cores), and `load` finds it on disk later. A failure is kept for
        `load` to report (the export is not tried twice). Blocking."""
        from toolatlas.retrieval.embed import ONNX_PRECISIONS

        with self._lock:
            if self.kind not in ONNX_PRECISIONS or self.progress.phase is not ModelPhase.WAITING:
                return
            try:
                self._export_if_needed()
            except Exception as exc:  # noqa: BLE001 - `load` reports it and degrades to BM25
                self._export_error = exc

    def _export_if_needed(self) -> None:
        """Write the ONNX export when state_dir has none (phase "exporting"); the caller holds
        the lock. Back to "waiting" after it; raises what the exporter raised."""
        from toolatlas.retrieval.embed import ensure_onnx_export, export_needed

        if not export_needed(self.state_dir):
            return
        self.progress = self.progress.to(ModelPhase.EXPORTING)
        log.info("retrieval.model_exporting: no ONNX export in state_dir yet; searching BM25 meanwhile")
        try:
            ensure_onnx_export(self.state_dir, self._cancel)
        finally:
            self.progress = self.progress.to(ModelPhase.WAITING)

    def load(self) -> Embedder | None:
        """The model, loaded once (phases "exporting" when the ONNX export is missing, then
        "loading"); None for kind "none" or after a failure (logged, counted: BM25 only)."""
        from toolatlas.retrieval.embed import ONNX_PRECISIONS, get_embedder

        with self._lock:
            if self.model is not None or self.progress.phase in (ModelPhase.OFF, ModelPhase.FAILED):
                return self.model
            t0 = time.perf_counter()
            try:
                if self._export_error is not None:
                    raise self._export_error
                if self.kind in ONNX_PRECISIONS:
                    self._export_if_needed()
                self.progress = self.progress.to(ModelPhase.LOADING)
                model = get_embedder(self.kind, self.state_dir, self.query_threads, cancel=self._cancel)
            except Exception as exc:  # noqa: BLE001 - any failure degrades, never crashes
                if self.cancelled:  # shutting down: not a failure of the model
                    log.info("retrieval.model_load_stopped: the daemon is shutting down")
                    return None
                self.fail(exc, "loading")
                return None
            self.seconds = time.perf_counter() - t0
            self.model = model
            self.progress = self.progress.to(ModelPhase.EMBEDDING)
            log.info("retrieval.model_loaded %s in %.1f s", model.name, self.seconds)
            return model

    def fail(self, exc: BaseException, during: str) -> None:
        """The model failed: BM25 from now on (no retry: the phase stays "failed")."""
        self.model = None
        self._counts["embedder_failures"] += 1
        self.progress = self.progress.to(ModelPhase.FAILED, error=str(exc))
        log.error("retrieval.embedder_failed kind=%s during %s: %s; searching bm25-only", self.kind, during, exc)

    def note(self, builder: IndexBuilder) -> None:
        """Record documents embedded of total (the caller holds the engine's update lock)."""
        done, total = builder.embedded()
        self.progress = self.progress.to(ModelPhase.EMBEDDING, embedded=done, total=total)

    def embed_step(
        self, lock: AbstractContextManager[Any], builder: IndexBuilder, publish: Callable[[Embedder], None],
        fail: Callable[[BaseException, str], None],
    ) -> bool:
        """Embed up to STEP_BATCH of `builder`'s documents that have no vector, outside
        `lock` (the engine's update lock: updates and searches go on meanwhile), or, when none
        is left, `publish(model)` under it. True while there is more to do."""
        model = self.model
        if model is None or self.cancelled:
            return False
        with lock:
            # With a shared cache, look a larger batch up there first (one round trip).
            todo = builder.pending(STEP_BATCH if builder.shared is None else SHARED_BATCH)
            if not todo:
                publish(model)
                return False
            self.note(builder)
        found = builder.fetch_shared(list(todo))
        keys = [k for k in todo if k not in found][:STEP_BATCH]
        try:
            vecs = model.embed([todo[k] for k in keys]) if keys else None
        except Exception as exc:  # noqa: BLE001 - the model died: BM25 only, keep serving
            fail(exc, "embedding")
            return False
        with lock:
            builder.add_shared(found)
            if vecs is not None:
                builder.add_vectors(keys, vecs)
            self.note(builder)
        if vecs is not None:
            builder.publish_shared(keys, vecs)
        return True

    def ready(self, n: int) -> None:
        self.progress = self.progress.to(ModelPhase.READY, embedded=n, total=n, hybrid_once=True)


__all__ = ["EMBEDDING_NEW", "FAILED", "LOADING", "ModelLoader", "ModelPhase", "ModelProgress"]
