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
