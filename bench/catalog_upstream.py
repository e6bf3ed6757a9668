"""A synthetic upstream for the benches: a stdio MCP server listing tools replicated from the
dev catalogs (ToolLens + MCPToolBench++ in ../shared/benchdata, 513 published tools).

    python bench/catalog_upstream.py --tools N [--shard K --shards S] [--page-size 500]

Copy j > 0 of a published tool gets a `_j` name suffix and a description with a variant
phrase, so every document text is distinct and must really be embedded. `--shards S` splits
the N tools into S contiguous blocks and serves block K (a daemon caps one upstream at
20,000 tools, so a 100,000-tool catalog is several upstreams, as it would be in practice).
tools/list pages by `--page-size` with offset cursors.

`catalog_tools()` and `tool_docs()` are importable: the second gives the documents the daemon
indexes for these tools when no capability cards are configured (the publisher's words), so
a bench can seed their embeddings.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Run as a daemon's stdio upstream, this file gets no PYTHONPATH: read catalogs with this tree's
# toolatlas (catalog.catalog_file), whichever one is installed.
if str(REPO / "daemon") not in sys.path:
    sys.path.insert(0, str(REPO / "daemon"))
BENCHDATA = REPO / ".." / "shared" / "benchdata"
CATALOGS = [BENCHDATA / "toollens" / "catalog.jsonl", BENCHDATA / "mcptoolbenchpp" / "catalog.jsonl"]
VARIANTS = ["for teams", "batch mode", "v2 API", "enterprise edition", "with caching", "legacy endpoint",
            "regional mirror", "sandbox", "read-only", "beta", "async", "extended", "lite", "pro"]


def catalog_tools(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """`n` tool definitions (name, description, inputSchema, base = index of the published
    tool it copies) cycling over the benchdata catalogs."""
    from toolatlas.catalog.catalog_file import read_catalog

    records = [line for p in CATALOGS for line in read_catalog(p)]
    rng = random.Random(seed)
    tools: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i in range(n):
        rec = records[i % len(records)]
        copy = i // len(records)
        base = re.sub(r"[^a-zA-Z0-9_-]+", "_", f"{rec.server}_{rec.name}").strip("_")[:44] or "tool"
        name = base if copy == 0 else f"{base}_{copy}"
        while name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        desc = rec.description
        desc = (f"{desc} (server: {rec.server})" if copy == 0
                else f"{desc} (server: {rec.server}, {rng.choice(VARIANTS)}, copy {copy})")
        tools.append({"name": name, "description": desc, "inputSchema": rec.input_schema or {"type": "object"},
                      "base": i % len(records)})
    return tools


def shard(tools: list[dict[str, Any]], k: int, shards: int) -> list[dict[str, Any]]:
    per = -(-len(tools) // shards)
    return tools[k * per:(k + 1) * per]


def tool_docs(tools: list[dict[str, Any]], server: str) -> list[Any]:
    """The daemon's index documents for `tools` served by upstream `server` (no cards)."""
    from toolatlas.retrieval.engine import ToolDoc

    return [ToolDoc(name=f"{server}__{t['name']}", server=server, tool=t["name"], description=t["description"],
                    input_schema=t["inputSchema"], server_summary="", tags=()) for t in tools]


def upstream_block(server: str, n: int, k: int = 0, shards: int = 1, extra: str = "") -> str:
    """A TOML [[upstream]] block serving shard `k` of `shards` of an `n`-tool catalog."""
    args = [str(Path(__file__).resolve()), "--tools", str(n), "--shard", str(k), "--shards", str(shards)]
    return (f'[[upstream]]\nname = "{server}"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
            f"args = {json.dumps(args)}\n{extra}")


def serve(tools: list[dict[str, Any]], page_size: int) -> None:
    import anyio
    import mcp_types as types
    from mcp.server.mcpserver import MCPServer

    listed = [types.Tool(name=t["name"], description=t["description"], input_schema=t["inputSchema"]) for t in tools]

    class CatalogServer(MCPServer):
        async def _handle_list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:  # noqa: ARG002
            cursor = params.cursor if params is not None else None
            start = int(cursor) if cursor and cursor.isdigit() else 0
            end = start + page_size
            return types.ListToolsResult(tools=listed[start:end], next_cursor=str(end) if end < len(listed) else None)

    anyio.run(CatalogServer("bench-catalog").run_stdio_async)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tools", type=int, required=True)
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--page-size", type=int, default=500)
    a = p.parse_args(argv)
    if not 0 <= a.shard < a.shards:
        p.error("--shard must be in [0, --shards)")
    serve(shard(catalog_tools(a.tools), a.shard, a.shards), max(1, a.page_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
