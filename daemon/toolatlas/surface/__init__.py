"""What MCP clients see: the meta-tools, the MCP server wiring, the Unix socket, the stdio shim."""
