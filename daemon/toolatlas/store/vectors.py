"""The engine's shared embedding cache (retrieval.shared.SharedVectors) over a `Replica`.

The engine calls it from its worker threads; each call hops onto the event loop the
replica runs on (`anyio.from_thread` with the loop's token) and is bounded: a store that is
down or slow answers "nothing shared" and the engine embeds as it would alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import anyio
import anyio.from_thread
import anyio.lowlevel
import numpy as np

from toolatlas.store.replica import Replica

log = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 15.0


class VectorBridge:
    """Vectors of one document space (`space`, `dim` floats each) through `replica`. Make it
    on the event loop (it keeps the loop's token)."""

    def __init__(self, replica: Replica, space: str, dim: int) -> None:
        self._replica = replica
        self.space = space
        self.dim = dim
        self._token = anyio.lowlevel.current_token()

    def fetch(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        if not self._replica.connected:
            return {}

        async def get() -> dict[bytes, bytes]:
            with anyio.move_on_after(FETCH_TIMEOUT_S):
                return await self._replica.get_vectors(self.space, list(keys))
            return {}

        try:
            raw = anyio.from_thread.run(get, token=self._token)
        except RuntimeError as exc:  # the loop is shutting down
            log.debug("store.vectors_fetch_skipped: %s", exc)
            return {}
        out: dict[bytes, np.ndarray] = {}
        for key, blob in raw.items():
            vec = np.frombuffer(blob, dtype=np.float32)
            if vec.shape[0] == self.dim:  # a vector of another width is not this space's
                out[key] = vec.copy()
        return out

    def publish(self, vectors: Mapping[bytes, np.ndarray]) -> None:
        items = [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in vectors.items()]
        try:
            anyio.from_thread.run_sync(self._replica.queue_vectors, self.space, items, token=self._token)
        except RuntimeError as exc:
            log.debug("store.vectors_publish_skipped: %s", exc)


__all__ = ["VectorBridge"]
