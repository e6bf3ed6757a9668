"""listing.follow_pages: a listing's pages followed to their end, bounded against an upstream
whose cursor never ends."""

from __future__ import annotations

import logging
import tracemalloc

import anyio
import pytest

from toolatlas.errors import UpstreamProtocolError
from toolatlas.upstream.listing import MAX_PAGES, follow_pages

GROWTH = 10_000  # characters a page's cursor grows by


async def test_a_cursor_that_grows_forever_ends_the_listing_without_keeping_every_cursor() -> None:
    # Each cursor is new and GROWTH characters longer than the last, and there is always a
    # next one. MAX_PAGES ends the listing; the cursors seen were kept whole, about
    # GROWTH * MAX_PAGES**2 / 2 bytes (200 MB here; 1.6 GB of the daemon's memory at 40 KB).
    async def fetch(cursor: str | None) -> tuple[list[str], str | None]:
        return [f"tool{len(cursor or '')}"], (cursor or "") + "x" * GROWTH

    tracemalloc.start()
    try:
        with pytest.raises(UpstreamProtocolError, match=f"did not end within {MAX_PAGES} pages"):
            with anyio.fail_after(60):
                await follow_pages(fetch, lambda item: item, "grows", "tools/list", 10_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    largest = GROWTH * MAX_PAGES
    assert peak < 8 * largest, f"peak {peak} bytes for cursors of at most {largest}"


async def test_a_repeated_cursor_ends_the_listing_naming_it() -> None:
    async def fetch(cursor: str | None) -> tuple[list[str], str | None]:
        return ["a"] if cursor is None else [], "again"

    with pytest.raises(UpstreamProtocolError, match="repeated its tools/list cursor 'again'"):
        await follow_pages(fetch, lambda item: item, "loops", "tools/list", 10_000)


async def test_names_listed_again_on_every_page_are_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    # A server that ignores the cursor and sends its whole list on every page: each repeat
    # was a warning of its own (450 lines for this listing, again at every re-list).
    async def fetch(cursor: str | None) -> tuple[list[str | None], str | None]:
        page = int(cursor or 0)
        return [f"tool{i}" for i in range(50)] + [None], (str(page + 1) if page < 9 else None)

    caplog.set_level(logging.WARNING, logger="toolatlas.upstream.listing")
    items = await follow_pages(fetch, lambda item: item, "pager", "tools/list", 10_000)
    assert items == [f"tool{i}" for i in range(50)]
    assert [r.getMessage() for r in caplog.records] == [
        "upstream pager lists 50 names more than once ('tool0', 'tool1', 'tool2', 'tool3', 'tool4', ...; "
        "450 extra entries) and 10 entries without a name in tools/list; keeping the first of each"]
