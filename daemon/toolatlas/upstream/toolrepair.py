"""A tools/list page's tools, repaired one by one before the SDK validates the page.

The SDK validates a tools/list result as one model: one tool whose `inputSchema` is a string,
`true` or missing failed the whole listing, and with it every tool of the upstream, which
went DEGRADED and was respawned after each backoff, its status reading "ValidationError: 5
validation errors for ListToolsResult". So each transport hands a tools/list page here first
(`transports.EofWatch`, and `pages.parse_big_page` for the stdio pages it parses itself),
and the damage costs only the tool that has it:

- a tool that is not an object, or whose `name` is not a string, is dropped (and logged);
- an `inputSchema` that is not an object becomes an open object schema (the upstream still
  checks the arguments), as an outsized one does (listing.py);
- `title` or `description` that is not a string, and `outputSchema`, `annotations`,
  `execution` or `_meta` that is not an object, or `icons` that is not a list, is removed.

What was changed is kept in the tool's `_meta` under `PROBLEMS`, which `listing.record_from_tool`
moves onto the record's `problems` (catalog_status shows them, the catalog logs them).
Only the top-level shape is checked here, in plain Python (a 20,000-tool page costs a few
milliseconds); a tool wrong deeper down still fails the page as before.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

PROBLEMS = "dev.toolatlas/problems"
_STRINGS = ("title", "description")
_OBJECTS = ("outputSchema", "annotations", "execution", "_meta")


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def repair(tool: dict[str, Any]) -> list[str]:
    """Repair `tool` (a dict whose `name` is a string) in place; what was changed."""
    problems: list[str] = []
    schema = tool.get("inputSchema")
    if not isinstance(schema, dict):
        what = "missing" if "inputSchema" not in tool else f"{_kind(schema)}, not an object"
        problems.append(f"inputSchema is {what}; replaced by an open object schema, the upstream checks the arguments")
        tool["inputSchema"] = {"type": "object"}
    for key in _STRINGS:
        if tool.get(key) is not None and not isinstance(tool[key], str):
            problems.append(f"{key} is {_kind(tool.pop(key))}, not a string; removed")
    for key in _OBJECTS:
        if tool.get(key) is not None and not isinstance(tool[key], dict):
            problems.append(f"{key} is {_kind(tool.pop(key))}, not an object; removed")
    if tool.get("icons") is not None and not isinstance(tool["icons"], list):
        problems.append(f"icons is {_kind(tool.pop('icons'))}, not a list; removed")
    if problems:
        tool.setdefault("_meta", {})[PROBLEMS] = problems
    return problems


def repaired(server: str, tools: list[Any]) -> list[Any]:
    """`tools` (a page's raw list) with each tool repaired in place; a new list without the
    tools that cannot be kept, or `tools` itself when none is dropped."""
    dropped = [t for t in tools if not isinstance(t, dict) or not isinstance(t.get("name"), str)]
    for tool in tools:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            repair(tool)  # what it changed is logged by the catalog, with the tool's other problems
    if not dropped:
        return tools
    for tool in dropped[:5]:
        logger.warning("upstream %s: tools/list: dropped %.200r: not a tool object with a string name", server, tool)
    if len(dropped) > 5:
        logger.warning("upstream %s: tools/list: dropped %d more entries like that", server, len(dropped) - 5)
    return [t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]


__all__ = ["PROBLEMS", "repair", "repaired"]
