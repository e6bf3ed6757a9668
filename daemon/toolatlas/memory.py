"""glibc heap tuning for a long-running daemon whose worker threads embed, rank and analyse.

Both calls are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import sys
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


# Memory blocks the interpreter held after the last full pass; the next full pass waits until
# it holds FULL_PASS_GROWTH times as many (see settle_heap). sys.getallocatedblocks() is cheap
# (a walk over pymalloc's arenas); gc.get_freeze_count() walks every frozen object (30-50 ms
# at 20,000 tools, the GIL held).
FULL_PASS_GROWTH = 2.0
_blocks_after_full = 0


def needs_full_pass(blocks: int, after_full: int) -> bool:
    """Whether the heap (`blocks` now, `after_full` after the last full pass, 0 = none yet)
    has grown enough that a full pass is due."""
    return after_full <= 0 or blocks >= FULL_PASS_GROWTH * after_full


def settle_heap() -> None:
    """Call after building a large long-lived structure (an index update, a Rift analysis).

    Freezes every object made since the last call (`gc.freeze`), so the automatic collections
    that follow scan only objects made since. Garbage that only the cyclic collector frees and
    that was made before this call is frozen with them until the next full pass. Measured on a
    2,000-tool daemon, six A/B pairs of 300 socket misses: the worst miss 76-97 ms in five
    runs of six without freezing (a full collection inside a search), 16-53 ms with.

    A full pass (unfreeze, collect everything, freeze again) is what reclaims cyclic garbage
    among frozen objects (the previous catalog's), but it is one GIL-holding call whose length
    grows with the heap: 0.3-1.4 s at 20,000 tools, during which no client is served (issue #15
    item 8). So it runs only when the interpreter's heap has grown FULL_PASS_GROWTH-fold since
    the last full pass (the first call is one), as CPython's own collector defers its oldest
    generation: frozen garbage stays bounded by that factor of the live heap, and a re-list
    of a stable catalog, which does not grow it, never waits for one."""
    global _blocks_after_full
    t0 = time.perf_counter()
    gc.freeze()  # a list splice: no object is visited
    full = needs_full_pass(sys.getallocatedblocks(), _blocks_after_full)
    if full:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        _blocks_after_full = sys.getallocatedblocks()
    log.debug("memory.settled in %.3f s (%s pass)", time.perf_counter() - t0, "full" if full else "freeze-only")
    trim_heap()
