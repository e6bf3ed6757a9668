"""The three meta-tools a client sees instead of hundreds (schemas as in the interface).

Kept free of mcp imports so benchmarks and token accounting can read the definitions cheaply.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from toolatlas.errors import BadInput

MAX_TOP_K = 20
TEXT_SHOWN = 60  # characters of a caller's value or key an error quotes

TOOL_SEARCH = "tool_search"
EXECUTE_TOOL = "execute_tool"
CATALOG_STATUS = "catalog_status"
FORMATS = ("json", "compact")  # tool_search's answer forms

# The meta-tools' structure. Their descriptions (and parameter descriptions) are replaced by
# the rendered templates (toolatlas.guidance); the texts here are what a skeleton shows.

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
                    "description": "How many tools to return (1-20); omitted: up to [search] default_top_k that fit, "
                                   "or none and a note.",
                },
                "servers": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Only search these servers (optional).",
                },
                "format": {
                    "type": "string",
                    "enum": list(FORMATS),
                    "description": "json (default, full schemas) or compact (short text).",
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


def _shown(value: Any) -> str:
    """A caller's value as an error quotes it: cut, so a reply does not grow with what it sent."""
    text = repr(value)
    return text if len(text) <= TEXT_SHOWN else text[:TEXT_SHOWN] + "..."


def clamp_top_k(value: Any, default: int = 5) -> int:
    """top_k clamped to [1, 20]; a missing value gives the default, a non-integer is BadInput."""
    if value is None:
        return default
    if isinstance(value, float) and not math.isfinite(value):  # 1e400 parses as inf
        raise BadInput(f"top_k must be an integer from 1 to {MAX_TOP_K}, got a number out of range")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise BadInput(f"top_k must be an integer from 1 to {MAX_TOP_K}, got {_shown(value)}")
    return max(1, min(MAX_TOP_K, int(value)))


def only_parameters(tool: str, args: Any) -> None:
    """BadInput naming any key of `args` that meta-tool `tool` has no parameter for: a key
    ignored would change the call silently (a tool's own arguments put beside `name` instead of
    inside `arguments` reached the tool as none at all; `server` for `servers` searched everything)."""
    known = next(t["inputSchema"]["properties"] for t in META_TOOLS if t["name"] == tool)
    extra = [k for k in args if k not in known]
    if not extra:
        return
    shown = ", ".join(json.dumps(k[:TEXT_SHOWN]) for k in extra[:5]) + (f" (+{len(extra) - 5} more)" if len(extra) > 5 else "")
    hint = " Put the tool's own arguments inside `arguments`." if tool == EXECUTE_TOOL else ""
    raise BadInput(f"{tool} has no parameter {shown}; it takes {', '.join(known)}.{hint}")


def servers_arg(value: Any) -> list[str] | None:
    """tool_search's (and `toolatlas/tools`') `servers`: None when missing, else a list of
    names, or BadInput (a lone name written as a string is shown how to write it)."""
    if value is None or (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        return value
    hint = f": write [{json.dumps(value[:TEXT_SHOWN])}]" if isinstance(value, str) else ""
    raise BadInput(f"`servers` must be a list of server names{hint}")


def tool_format(value: Any) -> str:
    """tool_search's `format`: "json" when missing, else one of FORMATS, or BadInput."""
    if value is None:
        return "json"
    if value not in FORMATS:
        raise BadInput(f"format must be one of {', '.join(FORMATS)}, got {_shown(value)}")
    return str(value)


COMPACT_DESCRIPTION_CHARS = 160
COMPACT_ENUM_VALUES = 4


def _type_of(spec: Any) -> str:
    if not isinstance(spec, dict):
        return "any"
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        shown = "|".join(json_text(v) for v in enum[:COMPACT_ENUM_VALUES])
        return shown + ("|..." if len(enum) > COMPACT_ENUM_VALUES else "")
    kind = spec.get("type")
    if isinstance(kind, list):
        return "|".join(str(k) for k in kind)
    if kind == "array":
        return f"list[{_type_of(spec.get('items'))}]"
    return str(kind) if kind else "any"


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


_PLAIN_NAME = re.compile(r"[\w.$@-]+")


def _param(name: str) -> str:
    """A parameter name as the listing shows it: as is when it is plain word characters, else
    JSON-quoted with everything but printable ASCII escaped. The name is the publisher's: a
    line break in it must not start a line of toolatlas's listing (a forged match marked
    [attested]), nor may an invisible character hide in it."""
    return name if _PLAIN_NAME.fullmatch(name) else json.dumps(name)


def signature(schema: Any) -> str:
    """`query: string, limit?: integer, unit: "km"|"mi"` from an inputSchema: required
    parameters first, optional ones marked `?`."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return ""
    props: dict[str, Any] = schema["properties"]
    raw = schema.get("required")
    required: list[Any] = raw if isinstance(raw, list) else []
    order = sorted(props, key=lambda k: (k not in required, list(props).index(k)))
    return ", ".join(f"{_param(k)}{'' if k in required else '?'}: {_type_of(props[k])}" for k in order)


def _one_line(text: Any) -> str:
    """`text` on one line: every run of whitespace (line and paragraph separators, carriage
    returns among them) one space. An upstream's reason in a note can quote its stderr, and a
    line break there must not start a line of toolatlas's listing (a forged match)."""
    return " ".join(str(text).split())


def render_compact(answer: dict[str, Any]) -> str:
    """A tool_search answer as a short text listing for a model: one numbered line per
    match (name and parameter signature), its description's first words, examples and
    note; what is degraded or still starting; how to get full schemas."""
    lines: list[str] = []
    if answer.get("degraded"):
        lines.append(f"degraded: {_one_line(answer['degraded'])} (results may be incomplete)")
    if answer.get("waiting_for"):
        lines.append("still starting, waiting for: " + "; ".join(_one_line(w) for w in answer["waiting_for"]))
    if answer.get("note"):
        lines.append(f"note: {_one_line(answer['note'])}")
    for i, m in enumerate(answer.get("matches") or (), 1):
        lines.append(f"{i}. {m['name']}({signature(m.get('inputSchema'))})" + (" [attested]" if m.get("attested") else ""))
        desc = " ".join(str(m.get("description") or "").split())
        if len(desc) > COMPACT_DESCRIPTION_CHARS:
            desc = desc[:COMPACT_DESCRIPTION_CHARS - 3].rsplit(" ", 1)[0] + "..."
        if desc:
            lines.append(f"   {desc}")
        if m.get("examples"):
            lines.append("   e.g. " + " | ".join(str(e) for e in m["examples"][:2]))
        if m.get("note"):
            lines.append(f"   note: {_one_line(m['note'])}")
    if not answer.get("matches"):
        lines.append("no matching tools")
    else:
        lines.append('Call execute_tool with the exact name; format "json" gives full schemas.')
    return "\n".join(lines)
