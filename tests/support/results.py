"""The parts of a tool result that tests assert on, from an SDK ``CallToolResult`` or from
the raw JSON a ``RawClient`` returns."""

from __future__ import annotations

from typing import Any

import mcp_types


def text(result: mcp_types.CallToolResult | dict[str, Any]) -> str:
    """Every text block of the result's content, joined."""
    if isinstance(result, dict):
        return "".join(c.get("text", "") for c in result.get("content", []))
    return "".join(c.text for c in result.content if isinstance(c, mcp_types.TextContent))


def structured(result: mcp_types.CallToolResult) -> Any:
    """The structured content of a result that must not be an error."""
    assert not result.is_error, result.content
    return result.structured_content


def error_text(result: mcp_types.CallToolResult) -> str:
    """The text of a result that must be an error."""
    assert result.is_error, result.content
    return text(result)


async def pool_call(pool: Any, server: str, tool: str, arguments: dict[str, Any] | None, **kw: Any) -> Any:
    """One tools/call through an upstream Pool as the gateway makes it (an UpstreamCall);
    returns the SDK CallToolResult the upstream answered."""
    import mcp_types

    from toolatlas.calls import UpstreamCall

    reply = await pool.call_tool(UpstreamCall(server=server, tool=tool, arguments=arguments, **kw))
    assert isinstance(reply.payload, mcp_types.CallToolResult) and reply.is_error == bool(reply.payload.is_error)
    return reply.payload
