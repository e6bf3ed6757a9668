"""Restore and persist the engine's index under `state_dir/retrieval/`.

What to keep and how to bring it back: the embedding cache (trimmed to the live vectors plus
a bounded number of older ones), the last snapshot's documents and hnsw labels, and the
hnswlib index when it is consistent with both. The file format (atomic writes, checksums)
is persist.py's; this module decides what goes in and what a corrupt file costs: a warning,
a counter, and a rebuild, never a crash.

Below the engine facade and above documents/index/persist, so the engine imports it and it
imports nothing of the engine (the engine <-> persist cycle is gone).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from toolatlas.retrieval import persist
from toolatlas.retrieval.documents import Entry, Vocab, make_entry
from toolatlas.retrieval.index import IndexBuilder, Snapshot

if TYPE_CHECKING:
    from toolatlas.retrieval.hnsw import HnswStore

log = logging.getLogger(__name__)

KEEP_MIN = 4096  # embedding-cache vectors kept on disk at least (live ones always)
KEEP_FACTOR = 4  # ... and up to this many times the live count, so flapping tools stay cheap


@dataclass(frozen=True)
class OnDisk:
    """What `read` found: the embedding cache ({} if there is no file; None without an
    embedder or when it is corrupt, see `vectors_corrupt`) and the last snapshot (None if
    there is none or it is corrupt)."""

    vec_of: dict[bytes, np.ndarray] | None
    vectors_corrupt: bool
    snapshot: persist.Restored | None
    corrupt: int  # files that failed their checks


@dataclass(frozen=True)
class Revived:
    """Entries rebuilt from a snapshot on disk, with the hnswlib index if it could be used
    (then every entry carries its label and nothing needs re-embedding or re-indexing)."""

    entries: dict[str, Entry]
    hnsw: HnswStore | None
    corrupt: int


@dataclass(frozen=True)
class RestoreResult:
    """What `restore` put back: the entries and catalog version of the snapshot on disk
    (None: there was none), whether its hnswlib index was usable, and files found corrupt."""

    entries: dict[str, Entry] | None
    version: int
    hnsw_ok: bool
    corrupt: int


def restore(state_dir: Path, space: str | None, dim: int, builder: IndexBuilder) -> RestoreResult:
    """Read the embedding cache and last snapshot of the vector space `space` (None: no
    embedder) into `builder` (its vectors, dirtiness and hnswlib index); the entries are the
    caller's to commit. Never raises CorruptFile."""
    disk = read(state_dir, space, dim)
    if disk.vec_of is not None:
        builder.vec_of = disk.vec_of
    if disk.vectors_corrupt:
        builder.vec_dirty = True
    if disk.snapshot is None:
        return RestoreResult(None, 0, False, disk.corrupt)
    revived = revive(disk.snapshot, builder.vec_of, dim, builder.vocab)
    builder.hnsw = revived.hnsw
    return RestoreResult(revived.entries, disk.snapshot.version, revived.hnsw is not None, disk.corrupt + revived.corrupt)


def read(state_dir: Path, space: str | None, dim: int) -> OnDisk:
    """Clear dead writers' temp files, then load the embedding cache (when there is a
    vector space: `space` names it, `dim` its width) and the snapshot of that space. Never
    raises CorruptFile."""
    stale = persist.remove_stale_temps(state_dir)
    if stale:
        log.info("retrieval.stale_temps_removed %s (left by a writer that died mid-write)", ", ".join(sorted(stale)))
    vec_of: dict[bytes, np.ndarray] | None = None
    vectors_corrupt = False
    corrupt = 0
    if space is not None:
        try:
            vec_of = persist.load_embeddings(state_dir, space, dim)
        except persist.CorruptFile as exc:
            corrupt += 1
            vectors_corrupt = True
            log.warning("retrieval.embedding_cache_corrupt %s; rebuilding it", exc)
    snapshot = None
    try:
        snapshot = persist.load_snapshot(state_dir, space or "none")
    except persist.CorruptFile as exc:
        corrupt += 1
        log.warning("retrieval.snapshot_corrupt %s; waiting for the catalog", exc)
    return OnDisk(vec_of=vec_of, vectors_corrupt=vectors_corrupt, snapshot=snapshot, corrupt=corrupt)


def revive(restored: persist.Restored, vec_of: dict[bytes, np.ndarray], dim: int, vocab: Vocab) -> Revived:
    """Entries for the restored documents (their terms in `vocab`); with the hnswlib file
    when it is on disk and every document's vector is in the embedding cache. A file hnswlib
    cannot load is counted corrupt and the dense index is rebuilt from the cache."""
    entries: dict[str, Entry] = {}
    for doc in restored.docs:
        entries[doc.name] = make_entry(doc, vocab)
    if not dim or restored.hnsw_path is None or not all(e.key in vec_of for e in entries.values()):
        return Revived(entries=entries, hnsw=None, corrupt=0)
    from toolatlas.retrieval.hnsw import HnswStore

    try:
        hnsw = HnswStore.load(restored.hnsw_path, dim, restored.next_label, live=len(entries), basis=restored.basis,
                              fit_energy=restored.basis_energy)
    except (RuntimeError, OSError, ValueError) as exc:
        log.warning("retrieval.hnsw_load_failed %s; rebuilding the dense index", exc)
        return Revived(entries=entries, hnsw=None, corrupt=1)
    for (name, e), label in zip(list(entries.items()), restored.labels):
        entries[name] = dataclasses.replace(e, label=label)
    return Revived(entries=entries, hnsw=hnsw, corrupt=0)


def vectors_to_keep(vec_of: dict[bytes, np.ndarray], live: set[bytes]) -> dict[bytes, np.ndarray]:
    """Every live vector, then the most recently used of the others (the cache's order is
    its recency order: IndexBuilder moves a key to the end when it is live again) up to
    max(4 x live, 4096) in all: an LRU bound on the file, and so on the cache."""
    keep = {k: v for k, v in vec_of.items() if k in live}
    limit = max(KEEP_FACTOR * len(live), KEEP_MIN)
    for k in reversed(vec_of):
        if len(keep) >= limit:
            break
        keep.setdefault(k, vec_of[k])
    return keep


@dataclass
class WriteHealth:
    """Why the last write of the index failed (None: it succeeded, or none was tried), for
    catalog_status (`index.persist_error`). A failure is logged when it differs from the one
    before, and the first success after failures is logged: a state_dir that refuses every
    write (read-only, full) is one warning, not one per catalog change."""

    error: str | None = None

    def record(self, state_dir: Path, exc: Exception | None) -> None:
        if exc is None:
            if self.error is not None:
                log.info("retrieval.persist_recovered dir=%s: the index is written again", state_dir)
            self.error = None
            return
        error = f"cannot write the index under {state_dir}: {exc}"
        if error != self.error:
            log.warning("retrieval.persist_failed dir=%s error=%s; the index is served from memory, a restart "
                        "rebuilds it from the upstreams' listings", state_dir, exc)
        self.error = error


def write(state_dir: Path, space: str | None, builder: IndexBuilder, snap: Snapshot,
          timings: dict[str, float] | None = None, health: WriteHealth | None = None) -> bool:
    """Write the embedding cache of vector space `space` (if it changed) and `snap` with the
    hnswlib index. Returns False when the disk refused (the engine counts it and serves on);
    logged by `health` (see WriteHealth), or at each failure without it. What it took goes
    to `timings["last_persist_s"]`, when given."""
    health = health if health is not None else WriteHealth()
    t0 = time.perf_counter()
    try:
        if space is not None and builder.vec_dirty:
            live = {e.key for e in builder.entries.values()}
            builder.remap(persist.save_embeddings(state_dir, space, vectors_to_keep(builder.vec_of, live)))
            builder.vec_dirty = False
        persist.save_snapshot(
            state_dir,
            space or "none",
            version=snap.version,
            docs=list(snap.docs),
            labels=[int(x) for x in snap.labels] if snap.labels is not None else [-1] * snap.n,
            hnsw=builder.hnsw if snap.labels is not None else None,
        )
    except (OSError, ValueError, TypeError, OverflowError, msgspec.EncodeError) as exc:  # the disk, or a document it cannot encode:
        health.record(state_dir, exc)  # never out of the catalog update (its upstream's tools would stay unsearchable)
        return False
    finally:
        persist.release_pages()  # the write read every kept vector through the mapping
        if timings is not None:
            timings["last_persist_s"] = time.perf_counter() - t0
    health.record(state_dir, None)
    return True


def release_pages() -> None:
    """After a snapshot copied its vectors out of the mapped embedding file: drop the pages
    it read from this process's resident memory (persist.release_pages)."""
    persist.release_pages()
