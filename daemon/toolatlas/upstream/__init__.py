"""Upstream MCP servers: transports, the per-upstream owner task, state machine, backoff, pool.

- ``state``: ``UpstreamState``, the transition table and the pure ``decide``.
- ``backoff``: ``backoff_delay`` (capped, jittered, zeroable).
- ``transports``: stdio (own: pid, exit status, stdin-close/SIGTERM/SIGKILL), SSE, HTTP.
- ``session``: ``UpstreamSession``, one upstream's owner task and supervision.
- ``pool``: ``Pool``, ``UpstreamStatus``, ``list_tools_once`` - what the daemon uses.
"""
