"""A stdio MCP upstream that leaks its secrets (issue #15 item 5): its `crash` tool writes
the TOKEN environment variable and its argv to stderr and exits with code 3, and from then on
(the `--marker` file exists) every start does the same at once, so the upstream stays down
with that stderr as its last words. Self-contained: run it as a script.

    python leaky.py --marker /path/crashed [ARGS...]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer


def leak_and_exit() -> None:
    sys.stderr.write(f"leaky: TOKEN={os.environ.get('TOKEN', '')} argv={' '.join(sys.argv[1:])}\n")
    sys.stderr.flush()
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker", required=True)
    args, _rest = parser.parse_known_args()
    marker = Path(args.marker)
    if marker.exists():
        leak_and_exit()
    server = MCPServer("leaky")

    @server.tool(description="Crash the server, leaking its environment on stderr.")
    def crash() -> str:
        marker.write_text("crashed")
        leak_and_exit()
        return "unreachable"

    anyio.run(server.run_stdio_async)


if __name__ == "__main__":
    main()
