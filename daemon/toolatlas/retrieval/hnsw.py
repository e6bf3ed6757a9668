"""The mutable hnswlib index behind the dense branch, updated insert-before-delete.

hnswlib cannot be snapshotted cheaply (100k vectors take ~25 s to index), so one index lives
across catalog versions and is mutated in place under a lock; each published snapshot keeps
its own label -> position map and its own vectors, and re-scores HNSW candidates exactly, so a
search on an older snapshot still returns consistent results.

hnswlib allows concurrent searches, and concurrent inserts, but not a search during an insert
or a delete. So searches and `save` (which only reads) share the index; `add`, `delete` and
`resize` hold it alone. A search thus never waits for a snapshot being written (seconds at
100k tools), only for one insert chunk or a batch of deletions.

Internal slots of deleted vectors are reused (`allow_replace_deleted=True` and
`add_items(..., replace_deleted=True)`); external labels are handed out monotonically, never
twice, because hnswlib re-labels a reused slot and an older snapshot may still hold the old label.

With a `basis` (dim x d, d < dim) the store holds each vector's d coordinates in that basis
(hnswlib's "ip" space) instead of the vector: the caller asks for more candidates than it
needs and scores them exactly on its own copy of the vectors. A vector of 384 float32 takes
1,536 bytes in hnswlib, its 128 coordinates 512; links and bookkeeping add ~190 either way.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import hnswlib
import numpy as np

M = 16
EF_CONSTRUCTION = 200
_CHUNK = 512  # add in chunks so concurrent searches wait at most one chunk


class SharedLock:
    """Many holders in shared mode or one in exclusive mode; a waiting exclusive holder
    goes before new shared ones (writers are rare and short, and must not starve)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if self._shared == 0:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class HnswStore:
    def __init__(self, dim: int, capacity: int = 1024, *, ef_construction: int = EF_CONSTRUCTION,
                 space: str = "cosine", basis: np.ndarray | None = None) -> None:
        """`space`: "cosine" (vectors normalised by hnswlib) or "ip" (distance 1 - dot product,
        vectors kept as given). `basis`: (dim, d) float32; the store then holds `vector @ basis`
        in the "ip" space (its distances are not the vectors' cosines)."""
        self.dim = dim
        self.basis = _checked_basis(basis, dim)
        self.lock = SharedLock()
        self.index = hnswlib.Index(space="ip" if self.basis is not None else space, dim=self.held_dim)
        self.index.init_index(
            max_elements=max(capacity, 16), ef_construction=ef_construction, M=M, allow_replace_deleted=True
        )
        self.index.set_num_threads(1)
        self.next_label = 0
        self.live = 0
        self.deleted = 0
        self._energy_reset(1.0)

    def _energy_reset(self, fit_energy: float) -> None:
        self.fit_energy = fit_energy  # mean squared norm of the coordinates of the vectors the basis came from
        self.added = 0  # vectors inserted since, and the sum of their coordinates' squared norms
        self.added_energy = 0.0

    def settle(self) -> None:
        """The vectors held now are those the basis was fitted on: their coordinates' mean
        squared norm (the share of a unit vector the basis keeps) is what later ones are
        compared with (`drifted`)."""
        self._energy_reset(self.added_energy / self.added if self.added else 1.0)

    def drifted(self, slack: float) -> bool:
        """The vectors inserted since `settle`, a quarter of those live and at least 1,024,
        keep `slack` less of themselves in the basis than the ones it came from: texts
        unlike them arrived, and candidates found in these coordinates miss more."""
        if self.basis is None or self.added < max(1024, self.live // 4):
            return False
        return self.added_energy / self.added < self.fit_energy - slack

    @property
    def held_dim(self) -> int:
        """The dimension hnswlib holds: the basis's, else the vectors'."""
        return self.basis.shape[1] if self.basis is not None else self.dim

    @classmethod
    def load(cls, path: Path, dim: int, next_label: int, live: int, basis: np.ndarray | None = None,
             fit_energy: float = 1.0) -> "HnswStore":
        store = cls.__new__(cls)
        store.dim = dim
        store.basis = _checked_basis(basis, dim)
        store.lock = SharedLock()
        idx = hnswlib.Index(space="ip" if store.basis is not None else "cosine", dim=store.held_dim)
        # the file does not say its dimension: the snapshot that names it (and its checksum)
        # carries the basis it was written with (persist.save_snapshot)
        idx.load_index(str(path), allow_replace_deleted=True)
        idx.set_num_threads(1)
        store.index = idx
        store.next_label = next_label
        store.live = live
        store.deleted = idx.get_current_count() - live
        store._energy_reset(fit_energy)
        return store

    def add(self, vectors: np.ndarray) -> np.ndarray:
        """Insert vectors under fresh labels (reusing deleted slots); returns the labels."""
        labels = self.reserve(vectors.shape[0])
        self.insert(vectors, labels)
        return labels

    def reserve(self, n: int) -> np.ndarray:
        """`n` fresh labels, for vectors `insert`ed later (never handed out twice)."""
        labels = np.arange(self.next_label, self.next_label + n, dtype=np.int64)
        self.next_label += n
        return labels

    def insert(self, vectors: np.ndarray, labels: np.ndarray) -> None:
        """Insert vectors under `labels` from `reserve` (reusing deleted slots)."""
        n = vectors.shape[0]
        if n == 0:
            return
        with self.lock.exclusive():
            reusable = min(self.deleted, n)
            needed = self.index.get_current_count() + n - reusable
            cap = self.index.get_max_elements()
            if needed > cap:
                self.index.resize_index(max(needed, 2 * cap))
        basis = self.basis
        for s in range(0, n, _CHUNK):
            part = vectors[s : s + _CHUNK] if basis is None else vectors[s : s + _CHUNK] @ basis
            if basis is not None:
                self.added_energy += float(np.einsum("ij,ij->", part, part))
            with self.lock.exclusive():
                self.index.add_items(part, labels[s : s + _CHUNK], replace_deleted=True)
        self.deleted -= reusable
        self.live += n
        self.added += n

    def delete(self, labels: Sequence[int]) -> None:
        with self.lock.exclusive():
            for label in labels:
                self.index.mark_deleted(int(label))
        self.deleted += len(labels)
        self.live -= len(labels)

    def search(
        self, vector: np.ndarray, k: int, ef: int, filter: Callable[[int], bool] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(labels, distances: 1 - cosine, or 1 - dot product in the "ip" space or the basis's
        coordinates) of up to `k` approximate nearest neighbours, nearest first (fewer if the
        index is small)."""
        k = min(k, self.live)
        if k <= 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        if self.basis is not None:
            vector = vector @ self.basis
        with self.lock.shared():
            # ef is one field of the index, shared by concurrent searches: one may run with
            # another's ef. hnswlib searches with max(ef, k), so each still gets k results.
            self.index.set_ef(max(ef, k))
            try:
                labels, dists = self.index.knn_query(vector.reshape(1, -1), k=k, filter=filter)
            except RuntimeError:
                # fewer than k reachable elements (deletions, or a narrow filter)
                return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        found: np.ndarray = labels[0].astype(np.int64)  # hnswlib is untyped
        dist: np.ndarray = dists[0].astype(np.float32)
        return found, dist

    def native_bytes(self) -> int:
        """What hnswlib holds in native memory for this index (its layout: per slot of
        capacity the level-0 links, the vector, the label, a lock, a level and a pointer;
        per element a label-map entry and its upper-level links), approximately."""
        cap = self.index.get_max_elements()
        count = self.index.get_current_count()
        m0 = 2 * self.index.M
        level0 = m0 * 4 + 4 + self.held_dim * 4 + 8
        upper = (self.index.M * 4 + 4) * count // max(1, self.index.M - 1)  # 1/(M-1) levels above 0 on average
        return int(cap * (level0 + 40 + 4 + 8) + count * 48 + upper)

    def rebased(self, basis: np.ndarray, vectors: np.ndarray, labels: np.ndarray) -> "HnswStore":
        """A new store holding `vectors` (every live one, under its label here) in `basis`,
        with this store's label counter: labels stay valid and are never handed out twice.
        This store is left as it is for the snapshots that still search it."""
        store = HnswStore(self.dim, capacity=max(1024, 2 * vectors.shape[0]), basis=basis)
        store.next_label = self.next_label
        store.insert(vectors, labels)
        store.settle()
        return store

    def save(self, path: Path) -> None:
        """Write the index to `path`. OSError when the file is short: hnswlib does not check
        its writes, so a full disk left a cut file that was taken for a written one (its
        checksum went into the snapshot) and failed to load at the next start."""
        with self.lock.shared():  # reads only: searches go on while it writes
            self.index.save_index(str(path))
            expected = self.index.index_file_size()
        written = os.path.getsize(path)
        if written != expected:
            raise OSError(errno.ENOSPC, f"hnswlib wrote {written} of {expected} bytes (is the disk full?)", str(path))


def _checked_basis(basis: np.ndarray | None, dim: int) -> np.ndarray | None:
    if basis is None:
        return None
    if basis.ndim != 2 or basis.shape[0] != dim or not 0 < basis.shape[1] <= dim:
        raise ValueError(f"a basis for {dim}-dimension vectors must be ({dim}, d); got {basis.shape}")
    return np.ascontiguousarray(basis, dtype=np.float32)


def principal_basis(vecs: np.ndarray, dims: int) -> np.ndarray:
    """(dim, min(dims, dim)) float32: the leading eigenvectors of the rows' second moment
    (uncentred: dot products, not variances, are what the coordinates must keep)."""
    vals, basis = np.linalg.eigh((vecs.T @ vecs).astype(np.float64))
    keep = np.argsort(-vals, kind="stable")[: min(dims, vecs.shape[1])]
    return np.ascontiguousarray(basis[:, keep], dtype=np.float32)
