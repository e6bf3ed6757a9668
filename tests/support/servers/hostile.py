"""A hostile stdio MCP upstream for the security tests (issue #15): its tools advertise
inputSchemas with a remote `$ref`, a `file://` `$ref`, a `$ref` cycle and a catastrophic
`pattern`; with `--malformed`, schemas the meta-schema rejects instead. Self-contained: run it
as a script.

    python hostile.py --ref-url http://127.0.0.1:P/x --ref-file /path/schema.json
    python hostile.py --malformed
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer

EVIL_PATTERN = "^(a+)+$"


def schemas(ref_url: str, ref_file: str) -> dict[str, dict[str, Any]]:
    """What each tool advertises (the server itself accepts any arguments). The SDK insists
    on `"type": "object"` at the top of every inputSchema."""
    return {
        "remote_ref": {"type": "object", "properties": {"x": {"$ref": ref_url}, "n": {"type": "integer"}}},
        "remote_root": {"type": "object", "$ref": ref_url},
        "file_ref": {"type": "object", "properties": {"x": {"$ref": ref_file}}},
        "ref_cycle": {"type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        "evil_pattern": {"type": "object", "properties": {"s": {"type": "string", "pattern": EVIL_PATTERN}},
                         "required": ["s"]},
        "evil_keys": {"type": "object", "patternProperties": {EVIL_PATTERN: {"type": "string"}},
                      "additionalProperties": False},
    }


class HostileServer(MCPServer):
    advertised: dict[str, dict[str, Any]] = {}

    async def list_tools(self) -> list[Any]:
        tools = await super().list_tools()
        return [t.model_copy(update={"input_schema": self.advertised.get(t.name, t.input_schema)}) for t in tools]


# Schemas the JSON Schema meta-schema rejects (#15 item 7), next to one good tool.
MALFORMED: dict[str, dict[str, Any]] = {
    "enum_number": {"type": "object", "properties": {"x": {"enum": 5}}},
    "enum_object": {"type": "object", "properties": {"x": {"enum": {"a": 1}}}},
    "items_enum_true": {"type": "object", "properties": {"x": {"type": "array", "items": {"enum": True}}}},
    "well_formed": {"type": "object", "properties": {"x": {"type": "string"}}},
}


def build(ref_url: str, ref_file: str, *, malformed: bool = False) -> HostileServer:
    server = HostileServer("hostile")
    server.advertised = MALFORMED if malformed else schemas(ref_url, ref_file)
    for name in server.advertised:
        server.add_tool(_accept_anything, name=name, description=f"hostile schema: {name.replace('_', ' ')}")
    return server


def _accept_anything(x: Any = None, n: Any = None, s: Any = None) -> str:
    return "called"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref-url", default="http://127.0.0.1:9/x")
    parser.add_argument("--ref-file", default="file:///nonexistent.json")
    parser.add_argument("--malformed", action="store_true", help="offer the MALFORMED tools instead")
    args = parser.parse_args()
    anyio.run(build(args.ref_url, args.ref_file, malformed=args.malformed).run_stdio_async)


if __name__ == "__main__":
    main()
