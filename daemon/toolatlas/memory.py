"""glibc heap tuning for a long-running daemon whose worker threads embed, rank and analyse.

Both calls are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt  # noqa: B018 - glibc has both; musl and others do not
        libc.malloc_trim
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def limit_arenas(arenas: int = 2) -> None:
    """glibc gives every thread that allocates its own heap arena; a daemon whose worker
    threads embed and rank grows its resident memory with them. Two arenas are enough."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_ARENA_MAX, arenas)


def trim_heap() -> None:
    """Return free heap pages to the OS. glibc keeps them after large transient allocations
    (an index update, a Rift analysis, a released model) until the top of the heap frees;
    call this after such work. Takes a few milliseconds."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def settle_heap() -> None:
    """Call after building a large long-lived structure (an index update, a Rift analysis).

    Collects cyclic garbage once, then freezes every surviving object (`gc.freeze`) so the
    automatic collections that follow scan only objects made since, and returns free pages.
    Unfrozen first, so what an earlier freeze kept and has since become garbage (the previous
    catalog's objects) is collected here. Takes 0.08-0.14 s at 2,000 tools (~125k objects).
    Measured on a 2,000-tool daemon, six A/B pairs of 300 socket misses: the worst miss
    76-97 ms in five runs of six without (a full collection inside a search), 16-53 ms with;
    p95 10.6-16.7 ms without, 10.0-14.8 ms with (lower in four pairs, within 0.6 ms in two)."""
    t0 = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    log.debug("memory.settled in %.3f s: %d objects frozen", time.perf_counter() - t0, gc.get_freeze_count())
    trim_heap()
