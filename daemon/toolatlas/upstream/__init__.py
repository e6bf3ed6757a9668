"""Upstream MCP servers: transports, the per-upstream owner task, state machine, backoff, pool."""
