"""glibc heap tuning for a long-running daemon whose worker threads embed, rank and analyse.

Both calls are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
import time
from typing import Any

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# (trim threshold, mmap threshold): lean for a daemon at rest and serving searches; held
# while the document model embeds a catalog in bulk (see tune_heap).
LEAN = (2 * 2**20, 1 * 2**20)
HELD = (64 * 2**20, 32 * 2**20)
_tuned = False  # tune_heap set the thresholds (the operator's environment did not)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt  # noqa: B018 - glibc has both; musl and others do not
        libc.malloc_trim
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def _thresholds(trim: int, mmap: int) -> None:
    if _LIBC is not None and _tuned:
        _LIBC.mallopt(_M_TRIM_THRESHOLD, trim)
        _LIBC.mallopt(_M_MMAP_THRESHOLD, mmap)


def tune_heap(arenas: int = 2) -> None:
    """Settings of glibc's allocator for a long-running daemon, made once at start (a setting
    the operator gave in the environment, MALLOC_*_ or GLIBC_TUNABLES, is left alone):

    - Arenas: glibc gives every thread that allocates its own heap arena; a daemon whose
      worker threads embed and rank grows its resident memory with them. Two are enough.
    - Fixed trim and mmap thresholds (LEAN): free memory at the top of a heap beyond 2 MB goes
      back to the OS at once, and blocks over 1 MB are mapped and unmapped. glibc's default
      thresholds rise to twice the largest mapped block ever freed (up to 64 MB), so after one
      large transient array a heap keeps tens of MB that searches freed. At 2,000 tools,
      warm, after 50 searches (bench/memory.py, bench/README stop 32): 220-242 MB without,
      214-217 MB with.
    - While the document model embeds in bulk, the thresholds are HELD high (hold_heap):
      its batches allocate and free tens of MB each, and mapping that afresh for every
      batch made a cold start's embedding 18 % slower. lean_heap restores LEAN and trims."""
    global _tuned
    if _LIBC is None:
        return
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "MALLOC_ARENA_MAX" not in os.environ and "arena_max" not in tunables:
        _LIBC.mallopt(_M_ARENA_MAX, arenas)
    _tuned = not any(k in os.environ for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")) \
        and not any(t in tunables for t in ("trim_threshold", "mmap_threshold", "top_pad"))
    _thresholds(*LEAN)


def hold_heap() -> None:
    """Bulk work begins (the document model loaded): keep freed memory for the next batch."""
    _thresholds(*HELD)


def lean_heap() -> None:
    """Bulk work is over (the document model released): lean thresholds, free pages back."""
    _thresholds(*LEAN)
    trim_heap()


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
    of a stable catalog, which does not grow it, never waits for one.

    The first call's full pass leaves frozen what was frozen before it: objects that whoever
    started this process froze (a pre-fork parent's `gc.freeze()` before forking it, as the
    gc documentation advises) are theirs. Unfreezing them would visit each one and, in a forked
    child, copy every page they share with the parent."""
    global _blocks_after_full
    t0 = time.perf_counter()
    if _blocks_after_full <= 0:  # the first call
        gc.collect()  # everything but what was frozen before it
        gc.freeze()
        full = True
    else:
        gc.freeze()  # a list splice: no object is visited
        full = needs_full_pass(sys.getallocatedblocks(), _blocks_after_full)
        if full:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
    if full:
        _blocks_after_full = sys.getallocatedblocks()
    log.debug("memory.settled in %.3f s (%s pass)", time.perf_counter() - t0, "full" if full else "freeze-only")
    trim_heap()
