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
"""

from __future__ import annotations

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
                 space: str = "cosine") -> None:
        """`space`: "cosine" (vectors normalised by hnswlib) or "ip" (distance 1 - dot product,
        vectors kept as given)."""
        self.dim = dim
        self.lock = SharedLock()
        self.index = hnswlib.Index(space=space, dim=dim)
        self.index.init_index(
            max_elements=max(capacity, 16), ef_construction=ef_construction, M=M, allow_replace_deleted=True
        )
        self.index.set_num_threads(1)
        self.next_label = 0
        self.live = 0
        self.deleted = 0

    @classmethod
    def load(cls, path: Path, dim: int, next_label: int, live: int) -> "HnswStore":
        store = cls.__new__(cls)
        store.dim = dim
        store.lock = SharedLock()
        idx = hnswlib.Index(space="cosine", dim=dim)
        idx.load_index(str(path), allow_replace_deleted=True)
        idx.set_num_threads(1)
        store.index = idx
        store.next_label = next_label
        store.live = live
        store.deleted = idx.get_current_count() - live
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
        for s in range(0, n, _CHUNK):
            with self.lock.exclusive():
                self.index.add_items(vectors[s : s + _CHUNK], labels[s : s + _CHUNK], replace_deleted=True)
        self.deleted -= reusable
        self.live += n

    def delete(self, labels: Sequence[int]) -> None:
        with self.lock.exclusive():
            for label in labels:
                self.index.mark_deleted(int(label))
        self.deleted += len(labels)
        self.live -= len(labels)

    def search(
        self, vector: np.ndarray, k: int, ef: int, filter: Callable[[int], bool] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(labels, distances: 1 - cosine, or 1 - dot product in the "ip" space) of up to `k`
        approximate nearest neighbours, nearest first (fewer if the index is small)."""
        k = min(k, self.live)
        if k <= 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
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
        level0 = m0 * 4 + 4 + self.dim * 4 + 8
        upper = (self.index.M * 4 + 4) * count // max(1, self.index.M - 1)  # 1/(M-1) levels above 0 on average
        return int(cap * (level0 + 40 + 4 + 8) + count * 48 + upper)

    def save(self, path: Path) -> None:
        with self.lock.shared():  # reads only: searches go on while it writes
            self.index.save_index(str(path))
