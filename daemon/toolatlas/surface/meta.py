"""The meta-tools' side of the surface: their definitions as one connection reads them
(rendered by the gateway, turned into the SDK's `Tool`s once per rendering) and the
tool_search result in either format."""

from __future__ import annotations

from typing import Any

import mcp_types as types

from toolatlas.gateway.ports import Connection, GatewayPort
from toolatlas.meta_tools import render_compact, tool_format
from toolatlas.surface.results import json_result

META_SEEN = "meta_fingerprint"  # Connection.extra key: the fingerprint of the meta-tools it last listed
_CACHE_MAX = 256
_cache: dict[str, list[types.Tool]] = {}  # fingerprint -> the SDK's tools (a few renderings live)


def meta_tools(gw: GatewayPort, conn: Connection) -> list[types.Tool]:
    """The meta-tools as `conn` reads them; remembers their fingerprint on the connection
    (a later change of their text is announced to it with tools/list_changed)."""
    meta = gw.meta_tools(conn)
    conn.extra[META_SEEN] = meta.fingerprint
    tools = _cache.get(meta.fingerprint)
    if tools is None:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        tools = _cache[meta.fingerprint] = [
            types.Tool(name=t["name"], description=t["description"], input_schema=t["inputSchema"]) for t in meta.tools]
    return tools


def search_result(answer: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """The tool_search result in the asked `format`: json (text and structuredContent), or
    compact (a short text listing only: structuredContent would carry the schemas again)."""
    if tool_format(args.get("format")) == "compact":
        return {"content": [{"type": "text", "text": render_compact(answer)}], "isError": False,
                "resultType": "complete"}
    return json_result(answer)


__all__ = ["META_SEEN", "meta_tools", "search_result"]
