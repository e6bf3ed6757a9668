"""The seam through which an engine shares its embedding cache with other replicas.

`SharedVectors` is what the engine needs of a shared embedding cache (the daemon plugs in
toolatlas.store's PostgreSQL bridge when `[store] url` is set): vectors by embedding-cache
key (the SHA-256 of the embedded text), in the engine's document vector space. Both calls
run in the engine's worker threads and must return promptly; a store that is down answers
`fetch` with {} (the engine embeds, as alone) and buffers or drops `publish` (a cache entry
any replica can recompute).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np


class SharedVectors(Protocol):
    def fetch(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        """The shared vectors of those `keys` another replica embedded (others are absent)."""

    def publish(self, vectors: Mapping[bytes, np.ndarray]) -> None:
        """Vectors this replica embedded, for the others."""


__all__ = ["SharedVectors"]
