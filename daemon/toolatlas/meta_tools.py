"""The three meta-tools a client sees instead of hundreds (schemas as in the interface).

Kept free of mcp imports so benchmarks and token accounting can read the definitions cheaply.
"""

from __future__ import annotations

from typing import Any

MAX_TOP_K = 20

TOOL_SEARCH = "tool_search"
EXECUTE_TOOL = "execute_tool"
CATALOG_STATUS = "catalog_status"

META_TOOLS: list[dict[str, Any]] = [
    {
        "name": TOOL_SEARCH,
        "description": (
            "Find the tools that fit a task among every tool this gateway federates. "
            "Describe the task in plain words; the result lists the best matches with their full "
            "input schemas. Then call one with execute_tool."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What you want to do, in plain words."},
                "top_k": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_TOP_K,
                    "default": 5,
                    "description": "How many tools to return (1-20, default 5).",
                },
                "servers": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Only search these servers (optional).",
                },
            },
            "required": ["query"],
        },
    },
    {
        "name": EXECUTE_TOOL,
        "description": (
            "Call a tool found with tool_search. `name` is a matches[].name from tool_search "
            "(server__tool); `arguments` must follow that tool's inputSchema."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The tool's name as tool_search returned it."},
                "arguments": {"type": "object", "description": "Arguments for the tool."},
            },
            "required": ["name"],
        },
    },
    {
        "name": CATALOG_STATUS,
        "description": "Report the federated servers, their connection state and tool counts, and the index.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]

META_NAMES = frozenset(t["name"] for t in META_TOOLS)


# What the surface passes as top_k when the caller left it out: the gateway then returns
# between 1 and [search] default_top_k results (adaptive.cut), or none when nothing fits.
AUTO_TOP_K = 0


def clamp_top_k(value: Any, default: int = 5) -> int:
    """top_k clamped to [1, 20]; a missing value gives the default, a non-integer is BadInput."""
    from toolatlas.errors import BadInput

    import math

    if value is None:
        return default
    if isinstance(value, float) and not math.isfinite(value):  # 1e400 parses as inf
        raise BadInput(f"top_k must be an integer from 1 to {MAX_TOP_K}, got a number out of range")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise BadInput(f"top_k must be an integer from 1 to {MAX_TOP_K}, got {value!r}")
    return max(1, min(MAX_TOP_K, int(value)))
