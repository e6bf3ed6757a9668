"""A hostile stdio MCP upstream for the security tests and the stall bench (issue #15).
Self-contained: run it as a script.

    python hostile.py [--ref-url http://127.0.0.1:P/x --ref-file /path/schema.json]
        [--tools N] [--description-bytes B] [--schema-bytes B] [--malformed] [--outputs]

- `--ref-url`/`--ref-file`: tools whose inputSchemas carry a remote `$ref`, a `file://` `$ref`,
  a `$ref` cycle and a catastrophic `pattern`.
- `--outputs`: tools whose results meet their outputSchema, break it, or meet a catastrophic
  `pattern` in it (`OUTPUTS`).
- `--malformed`: tools whose schemas the meta-schema rejects (`MALFORMED`), next to a good one.
- Outsized things: `--tools N` lists N more tools (`many_00000` ...: distinct names in a few
  families, short texts); `--description-bytes B` adds `huge_doc`, whose description is B
  bytes; `--schema-bytes B` adds `huge_schema`, whose inputSchema is about B bytes. Always:
  `blocks(n)` returns n one-character text content blocks, and `relist()` changes
  `many_00000`'s description and announces tools/list_changed (the upstream re-lists).
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer

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


# tool -> (outputSchema, the structured content its call returns)
OUTPUTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "evil_output": ({"type": "object", "properties": {"s": {"type": "string", "pattern": EVIL_PATTERN}}},
                    {"s": "a" * 34 + "!"}),
    "bad_output": ({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
                   {"n": "not an integer"}),
    "good_output": ({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, {"n": 1}),
}


FAMILIES = ("fetch", "store", "parse", "render", "sync", "audit", "index", "notify")


def many_tools(n: int, generation: int = 0) -> list[types.Tool]:
    """`n` listed-only tools (calls to them fail): names like `many_00042_parse_record`."""
    tools = []
    for i in range(n):
        family = FAMILIES[i % len(FAMILIES)]
        tools.append(types.Tool(
            name=f"many_{i:05d}_{family}_record", input_schema={"type": "object", "properties": {"id": {"type": "string"}}},
            description=f"{family.capitalize()} record number {i} of the bulk catalog"
                        + (f" (generation {generation})" if i == 0 and generation else "") + ".",
        ))
    return tools


def huge_schema(size: int) -> dict[str, Any]:
    """An inputSchema of about `size` bytes of JSON (many optional string properties)."""
    count = max(1, size // 40)
    return {"type": "object", "properties": {f"field_{i:07d}": {"type": "string"} for i in range(count)}}


class HostileServer(MCPServer):
    advertised: dict[str, dict[str, Any]] = {}
    outputs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    extra: list[types.Tool] = []
    many = 0
    generation = 0

    async def list_tools(self) -> list[Any]:
        tools = await super().list_tools()
        own = [t.model_copy(update={"input_schema": self.advertised.get(t.name, t.input_schema),
                                    "output_schema": self.outputs[t.name][0] if t.name in self.outputs else t.output_schema})
               for t in tools]
        return own + self.extra + many_tools(self.many, self.generation)

    async def _handle_call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> Any:
        if params.name == "blocks":  # built here: the SDK's result conversion of 400,000 blocks takes minutes
            n = int((params.arguments or {}).get("n", 1))
            return types.CallToolResult(content=[types.TextContent(type="text", text="x")] * n)
        if params.name in self.outputs:  # built here: the SDK's own output check would run `re`
            return types.CallToolResult(content=[types.TextContent(type="text", text="called")],
                                        structured_content=self.outputs[params.name][1])
        return await super()._handle_call_tool(ctx, params)


# Schemas the JSON Schema meta-schema rejects (#15 item 7), next to one good tool.
MALFORMED: dict[str, dict[str, Any]] = {
    "enum_number": {"type": "object", "properties": {"x": {"enum": 5}}},
    "enum_object": {"type": "object", "properties": {"x": {"enum": {"a": 1}}}},
    "items_enum_true": {"type": "object", "properties": {"x": {"type": "array", "items": {"enum": True}}}},
    "well_formed": {"type": "object", "properties": {"x": {"type": "string"}}},
}


def build(ref_url: str | None = None, ref_file: str | None = None, *, tools: int = 0,
          description_bytes: int = 0, schema_bytes: int = 0, malformed: bool = False,
          outputs: bool = False) -> HostileServer:
    server = HostileServer("hostile")
    server.advertised = MALFORMED if malformed else schemas(ref_url, ref_file) if ref_url and ref_file else {}
    server.outputs = OUTPUTS if outputs else {}
    for name in [*server.advertised, *server.outputs]:
        server.add_tool(_accept_anything, name=name, description=f"hostile schema: {name.replace('_', ' ')}")
    server.many = tools
    server.extra = []
    if description_bytes:
        text = "A tool whose description never ends. " * (description_bytes // 37 + 1)
        server.extra.append(types.Tool(name="huge_doc", description=text[:description_bytes],
                                       input_schema={"type": "object"}))
    if schema_bytes:
        server.extra.append(types.Tool(name="huge_schema", description="A tool with an outsized input schema.",
                                       input_schema=huge_schema(schema_bytes)))

    @server.tool(description="Return n one-character text content blocks.", structured_output=False)
    def blocks(n: int) -> str:  # answered by HostileServer._handle_call_tool
        return "unreachable"

    @server.tool(description="Change a listed tool's description and announce tools/list_changed.")
    async def relist(ctx: Context) -> str:
        server.generation += 1
        with contextlib.suppress(Exception):
            await ctx.request_context.session.send_tool_list_changed()
        with contextlib.suppress(Exception):
            await ctx.notify_tools_changed()
        return f"generation {server.generation}"

    return server


def _accept_anything(x: Any = None, n: Any = None, s: Any = None) -> str:
    return "called"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref-url")
    parser.add_argument("--ref-file")
    parser.add_argument("--tools", type=int, default=0)
    parser.add_argument("--description-bytes", type=int, default=0)
    parser.add_argument("--schema-bytes", type=int, default=0)
    parser.add_argument("--malformed", action="store_true", help="offer the MALFORMED tools")
    parser.add_argument("--outputs", action="store_true", help="offer the OUTPUTS tools")
    args = parser.parse_args()
    server = build(args.ref_url, args.ref_file, tools=args.tools, description_bytes=args.description_bytes,
                   schema_bytes=args.schema_bytes, malformed=args.malformed, outputs=args.outputs)
    anyio.run(server.run_stdio_async)


if __name__ == "__main__":
    main()
