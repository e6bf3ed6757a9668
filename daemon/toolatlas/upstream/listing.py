"""An upstream's tool listing: every page of tools/list, and the one conversion of an SDK
`Tool` into the gateway's `ToolRecord` (title, outputSchema and annotations kept). Past
this module no layer above `upstream/` sees an MCP type.

The conversion bounds what an upstream can make the daemon carry: a description over the
upstream's `max_description_chars` is cut, an inputSchema over `max_schema_bytes` of JSON is
replaced by an open object schema (the upstream still checks the arguments); each cut is
logged and kept on the record (`ToolRecord.problems`) for catalog_status. It runs in a
worker thread: hashing 20,000 tools held the event loop for a tenth of a second or more.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import mcp_types
import msgspec
from mcp import Client

from toolatlas.catalog.model import ToolRecord
from toolatlas.config import MAX_DESCRIPTION_CHARS, MAX_SCHEMA_BYTES, StdioUpstream, Upstream
from toolatlas.errors import UpstreamProtocolError
from toolatlas.upstream.pages import PAGES, SLICE
from toolatlas.upstream.toolrepair import PROBLEMS

logger = logging.getLogger(__name__)

# Bounds on one listing: a hostile or broken upstream cannot page forever or flood the index.
MAX_PAGES = 200
MAX_TOOLS = 20_000


OPEN_SCHEMA: dict[str, Any] = {"type": "object"}
_json = msgspec.json.Encoder()


def _cut_description(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, ending with a note saying it was cut."""
    note = f" [... cut by toolatlas: {len(text)} characters, max_description_chars is {limit}]"
    return text[: limit - len(note)] + note


def record_from_tool(
    server: str, tool: mcp_types.Tool, *, max_description_chars: int = MAX_DESCRIPTION_CHARS,
    max_schema_bytes: int = MAX_SCHEMA_BYTES,
) -> ToolRecord:
    """The gateway's record of `server`'s `tool`, its description and schema bounded."""
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
    problems: list[str] = list(meta.pop(PROBLEMS, ())) if isinstance(meta := tool.meta, dict) else []
    description = tool.description
    if description is not None and len(description) > max_description_chars:
        problems.append(f"description cut from {len(description)} to {max_description_chars} characters "
                        "(max_description_chars)")
        description = _cut_description(description, max_description_chars)
    schema = tool.input_schema
    size = len(_json.encode(schema)) if schema else 0
    if size > max_schema_bytes:
        problems.append(f"inputSchema of {size} bytes is over max_schema_bytes ({max_schema_bytes}); "
                        "replaced by an open object schema, the upstream checks the arguments")
        schema = dict(OPEN_SCHEMA)
    output_schema = tool.output_schema
    if output_schema and len(_json.encode(output_schema)) > max_schema_bytes:
        problems.append(f"outputSchema is over max_schema_bytes ({max_schema_bytes}); dropped")
        output_schema = None
    return ToolRecord.make(
        server,
        tool.name,
        description,
        schema,
        title=tool.title,
        output_schema=output_schema,
        annotations=annotations or None,
        problems=tuple(problems),  # logged by the catalog when the tool enters or changes
    )


def records(up: Upstream, tools: list[mcp_types.Tool]) -> list[ToolRecord]:
    """`tools` as records under `up`'s bounds (blocking: call it in a worker thread). A tool
    that needs MCP task augmentation (`execution.taskSupport` "required") is left out, and
    logged: toolatlas does not run task-augmented calls, so each call of it would fail."""
    kept = [t for t in tools if t.execution is None or t.execution.task_support != "required"]
    if len(kept) < len(tools):
        left = sorted({t.name for t in tools} - {t.name for t in kept})
        logger.warning("upstream %s: %d tools need MCP task augmentation (execution.taskSupport 'required'), "
                       "which toolatlas does not offer, so they are not offered: %s",
                       up.name, len(left), ", ".join(repr(name[:64]) for name in left[:10]))
    return [record_from_tool(up.name, t, max_description_chars=up.max_description_chars,
                             max_schema_bytes=up.max_schema_bytes) for t in kept]


T = TypeVar("T")


async def follow_pages(
    fetch: Callable[[str | None], Awaitable[tuple[list[T], str | None]]], ident: Callable[[T], object],
    server: str, method: str, limit: int, on_page: Callable[[int, int], None] | None = None,
) -> list[T]:
    """Every item of every page `fetch(cursor)` returns (items, next cursor), following the
    cursor to the end; an item whose `ident` was seen (or is None) is kept once.

    Raises UpstreamProtocolError on a repeated cursor, more than MAX_PAGES pages or `limit`
    items; SDK errors propagate. The caller bounds the time; `on_page(pages, items)` hears
    how far the listing got after each page."""
    items: list[T] = []
    seen: set[object] = set()
    repeated: dict[object, int] = {}  # said in one line at the end, not one per item and page
    # Digests, not the cursors: an upstream whose cursor grew 40 KB a page had the daemon
    # hold 800 MB of cursors (1.6 GB at its peak) before MAX_PAGES ended the listing.
    seen_cursors: set[bytes] = set()
    cursor: str | None = None
    for n in range(MAX_PAGES):
        page, cursor = await fetch(cursor)
        for item in page:
            key = ident(item)
            if key is None or key in seen:
                repeated[key] = repeated.get(key, 0) + 1
                continue
            seen.add(key)
            items.append(item)
        if on_page is not None:
            on_page(n + 1, len(items))
        if len(items) > limit:
            raise UpstreamProtocolError(f"upstream {server!r} lists more than {limit} items in {method}")
        if not cursor:
            _say_repeated(server, method, repeated)
            return items
        digest = hashlib.blake2b(cursor.encode(errors="surrogatepass"), digest_size=16).digest()
        if digest in seen_cursors:
            raise UpstreamProtocolError(f"upstream {server!r} repeated its {method} cursor {cursor[:80]!r}")
        seen_cursors.add(digest)
    raise UpstreamProtocolError(f"upstream {server!r} {method} did not end within {MAX_PAGES} pages")


def _say_repeated(server: str, method: str, repeated: dict[object, int]) -> None:
    """One warning for the items a listing had more than once (or without a name)."""
    if not repeated:
        return
    unnamed = repeated.pop(None, 0)
    names = ", ".join(repr(key) for key in list(repeated)[:5]) + (", ..." if len(repeated) > 5 else "")
    parts = [f"{len(repeated)} names more than once ({names}; {sum(repeated.values())} extra entries)"] if repeated else []
    parts += [f"{unnamed} entries without a name"] if unnamed else []
    logger.warning("upstream %s lists %s in %s; keeping the first of each", server, " and ".join(parts), method)


async def list_all_tools(client: Client, name: str,
                         on_page: Callable[[int, int], None] | None = None) -> list[mcp_types.Tool]:
    """Every tool the upstream offers, following `nextCursor` to the end (bounded by
    MAX_PAGES and MAX_TOOLS; see `follow_pages`). Always fetched, never kept in the SDK
    client's response cache: the gateway's records are the one copy of a listing (a cached
    first page of 20,000 tools held its models beside them)."""

    async def fetch(cursor: str | None) -> tuple[list[mcp_types.Tool], str | None]:
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        big = PAGES.take(page.meta)  # a large page the stdio transport parsed in slices
        return (page.tools if big is None else await _absorb(client, big)), page.next_cursor

    return await follow_pages(fetch, lambda tool: tool.name, name, "tools/list", MAX_TOOLS, on_page)


async def _absorb(client: Client, tools: list[mcp_types.Tool]) -> list[mcp_types.Tool]:
    """A page the transport parsed in slices (pages.py), absorbed by the SDK session slice by
    slice as its response cache does a hit (its per-tool output-schema state; on 2026-07-28 it
    drops tools with invalid x-mcp-header annotations), with a checkpoint between slices. The
    session already absorbed the empty stand-in, which cleared the state of a one-page listing."""
    kept: list[mcp_types.Tool] = []
    for start in range(0, len(tools), SLICE):
        part = mcp_types.ListToolsResult(tools=tools[start:start + SLICE])
        kept.extend(client.session._absorb_tool_listing(part, complete=False).tools)  # noqa: SLF001 (mcp==2.3.0)
        await anyio.sleep(0)
    return kept


async def converted(up: Upstream, tools: list[mcp_types.Tool]) -> list[ToolRecord]:
    """`tools` as the gateway's records, converted in a worker thread (20,000 tools take
    seconds). The daemon's own work: callers bound the upstream's answer, not this."""
    return await anyio.to_thread.run_sync(records, up, tools)


class ListingGate:
    """Local (stdio) upstreams list and convert their tools one at a time.

    At 100,000 tools from 20 stdio upstreams listing at once, the pages of all of them were
    parsed into the SDK's models together, and the records made from them were interleaved
    with those models in pymalloc's pools: when the models went, ~130 MB of arenas stayed
    allocated around the records, one live object in each (bench/memory.py --tools 100000:
    VmRSS 675 MB, 290 arenas of which ~173 MB in use; one at a time: 572-582 MB, 193-197
    arenas; bench/README.md, stop 47). A local upstream's listing is the daemon's own CPU work on two
    cores, so taking turns costs little time; a remote one's is mostly the network's, and
    does not take a turn.

    A turn that has lasted `hold_s` no longer holds the others back: a slow or hung upstream
    delays the rest by at most that, and they go on alongside it."""

    def __init__(self, hold_s: float = 5.0) -> None:
        self.hold_s = hold_s
        self._lock: anyio.Lock | None = None  # made in the event loop that uses it
        self._since = 0.0  # when the current turn began

    @contextlib.asynccontextmanager
    async def turn(self, up: Upstream) -> AsyncIterator[None]:
        if not isinstance(up, StdioUpstream):
            yield
            return
        lock = self._lock = self._lock or anyio.Lock()
        while True:
            remaining = self._since + self.hold_s - anyio.current_time()
            if lock.locked() and remaining <= 0:
                yield  # the holder is slow: alongside it
                return
            with anyio.move_on_after(max(remaining, 0.0) if lock.locked() else math.inf):
                await lock.acquire()
                break
        try:
            self._since = anyio.current_time()
            yield
        finally:
            lock.release()


LISTING_GATE = ListingGate()


async def list_records(client: Client, up: Upstream) -> list[ToolRecord]:
    """`list_all_tools` as the gateway's records (on `LISTING_GATE`'s turn)."""
    async with LISTING_GATE.turn(up):
        return await converted(up, await list_all_tools(client, up.name))
