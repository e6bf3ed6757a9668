"""An upstream's tool listing: every page of tools/list, and the one conversion of an SDK
`Tool` into the gateway's `ToolRecord` (title, outputSchema and annotations kept). Past
this module no layer above `upstream/` sees an MCP type."""

from __future__ import annotations

import logging

import mcp_types
from mcp import Client

from toolatlas.catalog.model import ToolRecord
from toolatlas.errors import UpstreamProtocolError

logger = logging.getLogger(__name__)

# Bounds on one listing: a hostile or broken upstream cannot page forever or flood the index.
MAX_PAGES = 200
MAX_TOOLS = 20_000


def record_from_tool(server: str, tool: mcp_types.Tool) -> ToolRecord:
    """The gateway's record of `server`'s `tool`."""
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
    return ToolRecord.make(
        server,
        tool.name,
        tool.description,
        tool.input_schema,
        title=tool.title,
        output_schema=tool.output_schema,
        annotations=annotations or None,
    )


async def list_all_tools(client: Client, name: str, *, refresh: bool = True) -> list[mcp_types.Tool]:
    """Every tool the upstream offers, following `nextCursor` to the end (bounded).

    Raises UpstreamProtocolError on a repeated cursor, more than MAX_PAGES pages or
    MAX_TOOLS tools; SDK errors propagate. The caller bounds the time.
    """
    tools: list[mcp_types.Tool] = []
    seen_names: set[str] = set()
    seen_cursors: set[str] = set()
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
        for tool in page.tools:
            if tool.name in seen_names:
                logger.warning("upstream %s lists tool %r twice; keeping the first", name, tool.name)
                continue
            seen_names.add(tool.name)
            tools.append(tool)
        if len(tools) > MAX_TOOLS:
            raise UpstreamProtocolError(f"upstream {name!r} lists more than {MAX_TOOLS} tools")
        cursor = page.next_cursor
        if not cursor:
            return tools
        if cursor in seen_cursors:
            raise UpstreamProtocolError(f"upstream {name!r} repeated tools/list cursor {cursor[:80]!r}")
        seen_cursors.add(cursor)
    raise UpstreamProtocolError(f"upstream {name!r} tools/list did not end within {MAX_PAGES} pages")




async def list_records(client: Client, name: str, *, refresh: bool = True) -> list[ToolRecord]:
    """`list_all_tools` as the gateway's records."""
    return [record_from_tool(name, t) for t in await list_all_tools(client, name, refresh=refresh)]
