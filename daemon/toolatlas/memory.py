"""glibc heap tuning for a long-running daemon whose worker threads embed, rank and analyse.

Both calls are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import logging
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
