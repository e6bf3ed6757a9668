"""toolatlas: an MCP tool gateway.

Kept import-free on purpose: `toolatlas shim` must start in well under 150 ms, so nothing here
may pull in mcp, numpy or the retrieval stack.
"""

__version__ = "0.1.0"
