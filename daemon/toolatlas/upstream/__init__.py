"""Upstream MCP servers: transports, the per-upstream owner task, state machine, backoff, pool.

- ``state``: ``UpstreamState``, the transition table and the pure ``decide``.
- ``backoff``: ``backoff_delay`` (capped, jittered, zeroable), the package's only retry delay.
- ``transports``: stdio (own: pid, exit status, stdin-close/SIGTERM/SIGKILL), SSE, HTTP.
- ``client``: ``make_client``, ``describe``, ``LossReason`` / ``classify`` (failures by type)
  and ``call_error`` (the one mapping of SDK errors onto toolatlas errors).
- ``listing``: every page of tools/list, the one ``mcp.Tool`` -> ``ToolRecord`` converter.
- ``session``: ``UpstreamSession``, one upstream's owner task; ``Connection``, one attempt.
- ``supervision``: health checks, the 2026-07-28 listen stream, re-lists of a READY session.
- ``pool``: ``Pool``, ``UpstreamStatus``, ``list_tools_once`` - what the daemon uses.
"""
