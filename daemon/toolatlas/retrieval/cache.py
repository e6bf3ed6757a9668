"""A thread-safe LRU cache with a time-to-live, for query results and query vectors."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

if TYPE_CHECKING:
    from toolatlas.retrieval.embed import Embedder

log = logging.getLogger(__name__)

V = TypeVar("V")

# Longer query texts are held in the caches as their SHA-256: a key is kept as long as its
# entry, and a query may be megabytes long (up to the daemon's max_message_bytes), so 1,024
# result entries and 512 query vectors keyed by the text itself grew the daemon by about
# 7 MB a distinct 3 MB query, to gigabytes in all.
KEY_TEXT_CHARS = 512


def text_key(text: str) -> str | bytes:
    """`text` as a cache key: itself up to KEY_TEXT_CHARS characters, else its SHA-256."""
    if len(text) <= KEY_TEXT_CHARS:
        return text
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class TtlLru(Generic[V]):
    """At most `maxsize` entries, each valid for `ttl` seconds (0 disables expiry).

    `maxsize` 0 disables the cache (every get misses, puts are dropped). Counts hits and misses.
    """

    def __init__(self, maxsize: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.maxsize = maxsize
        self.ttl = ttl
        self._clock = clock
        self._data: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, *, count_miss: bool = True) -> V | None:
        with self._lock:
            item = self._data.get(key)
            if item is not None:
                stamp, value = item
                if self.ttl <= 0 or self._clock() - stamp < self.ttl:
                    self._data.move_to_end(key)
                    self.hits += 1
                    return value
                del self._data[key]
            if count_miss:
                self.misses += 1
            return None

    def put(self, key: Hashable, value: V) -> None:
        if self.maxsize <= 0:
            return
        with self._lock:
            self._data[key] = (self._clock(), value)
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class QueryVectors:
    """Query vectors by (query embedder, stripped query), LRU-bounded; a failure to embed
    is counted and logged, and that search runs bm25-only."""

    def __init__(self, counts: dict[str, int], size: int = 512) -> None:
        self._lru: TtlLru[np.ndarray] = TtlLru(size, 0)
        self._counts = counts

    def get(self, emb: Embedder | None, query: str) -> np.ndarray | None:
        if emb is None:
            return None
        q = query.strip()
        key = (emb.query_name, text_key(q))
        vec = self._lru.get(key)
        if vec is None:
            try:
                vec = emb.embed_queries([q])[0]
            except Exception as exc:  # noqa: BLE001 - degrade this search, keep serving
                self._counts["embedder_failures"] += 1
                log.warning("retrieval.query_embed_failed error=%s; this search is bm25-only", exc)
                return None
            self._lru.put(key, vec)
        return vec
