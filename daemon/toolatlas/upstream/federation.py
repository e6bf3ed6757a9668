"""Resources and prompts of one upstream, fetched on demand through its warm session.

Each function takes the entered SDK `Client` (the owner task's; see `session.py`) and
returns wire-form dicts (`model_dump(by_alias=True, exclude_none=True)`), so no layer above
`upstream/` sees an MCP type. Listings follow `nextCursor` to the end, bounded like tool
listings; the SDK's response cache is bypassed (the gateway keeps its own, invalidated by
list_changed).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types
from mcp import Client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from toolatlas.upstream.listing import follow_pages

logger = logging.getLogger(__name__)

MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
# Bounds on one listing of resources, resource templates or prompts.
MAX_ITEMS = 20_000

# kind -> (method, result field, the key that names an item)
KINDS: dict[str, tuple[str, str, str]] = {
    "resources": ("resources/list", "resources", "uri"),
    "templates": ("resources/templates/list", "resourceTemplates", "uriTemplate"),
    "prompts": ("prompts/list", "prompts", "name"),
}


def _wire(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return out


def capabilities(client: Client) -> frozenset[str]:
    """What the upstream said it offers, of what the gateway federates: "resources",
    "prompts", "logging"."""
    caps = client.server_capabilities
    offered = {"resources": caps.resources, "prompts": caps.prompts, "logging": caps.logging}
    return frozenset(k for k, v in offered.items() if v is not None)


def _pager(client: Client, kind: str) -> Callable[[str | None], Awaitable[Any]]:
    session = client.session

    def params(cursor: str | None) -> mcp_types.PaginatedRequestParams:
        return mcp_types.PaginatedRequestParams(cursor=cursor)

    if kind == "resources":
        return lambda cursor: session.list_resources(params=params(cursor))
    if kind == "templates":
        return lambda cursor: session.list_resource_templates(params=params(cursor))
    return lambda cursor: session.list_prompts(params=params(cursor))


async def list_all(client: Client, server: str, kind: str) -> list[dict[str, Any]]:
    """Every item of `kind` ("resources", "templates", "prompts") `server` offers, every page;
    an item listed twice (by its uri, uriTemplate or name) is kept once. Bounded by MAX_PAGES
    and MAX_ITEMS (UpstreamProtocolError); the caller bounds the time."""
    method, field, key = KINDS[kind]
    pager = _pager(client, kind)

    async def fetch(cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
        page = _wire(await pager(cursor))
        return list(page.get(field, [])), page.get("nextCursor")

    def ident(item: dict[str, Any]) -> str | None:
        value = item.get(key)
        return value if isinstance(value, str) else None

    return await follow_pages(fetch, ident, server, method, MAX_ITEMS)


async def read_resource(client: Client, uri: str) -> dict[str, Any]:
    """resources/read of `uri` (the upstream's own URI). An input_required answer (2026-07-28)
    is driven by the client's elicitation callback, like a legacy caller's tool call."""
    return _wire(await client.read_resource(uri, cache_mode="bypass"))


async def get_prompt(client: Client, name: str, arguments: dict[str, str] | None) -> dict[str, Any]:
    """prompts/get of the upstream's prompt `name`."""
    return _wire(await client.get_prompt(name, arguments))


async def set_log_level(client: Client, level: str) -> None:
    """logging/setLevel on a handshake-era upstream (the deprecated helper is not used: it
    warns on every call)."""
    request = mcp_types.SetLevelRequest(params=mcp_types.SetLevelRequestParams(level=level))  # type: ignore[arg-type]
    await client.session.send_request(request, mcp_types.EmptyResult)


def resource_uris(result: Any) -> tuple[str, ...]:
    """The URIs of the resource links and embedded resources in a tool result."""
    uris: list[str] = []
    for block in getattr(result, "content", None) or ():
        if isinstance(block, mcp_types.ResourceLink):
            uris.append(str(block.uri))
        elif isinstance(block, mcp_types.EmbeddedResource):
            uris.append(str(block.resource.uri))
    return tuple(uris)


__all__ = ["KINDS", "MODERN", "capabilities", "get_prompt", "list_all", "read_resource", "resource_uris", "set_log_level"]
