"""Namespaced tool names: `server__tool`, valid for ^[a-zA-Z0-9_-]{1,64}$.

A name that had to be changed (characters replaced, or too long) gets a short hash of the
original upstream name appended. The result depends only on (server, tool), so it is stable
across restarts and independent of sibling tools.
"""

from __future__ import annotations

import hashlib
import re

SEP = "__"
MAX_LEN = 64
VALID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_BAD = re.compile(r"[^a-zA-Z0-9_-]")


def namespaced(server: str, tool: str) -> str:
    """Return the gateway name of upstream tool `tool` on server `server`."""
    clean = _BAD.sub("_", tool) or "_"
    full = f"{server}{SEP}{clean}"
    if clean == tool and len(full) <= MAX_LEN:
        return full
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    room = MAX_LEN - len(server) - len(SEP) - 1 - len(digest)
    return f"{server}{SEP}{clean[:max(room, 1)]}_{digest}"[:MAX_LEN]


def split(name: str) -> tuple[str, str] | None:
    """Split `server__tool` at the first separator, or None if it has none."""
    server, sep, rest = name.partition(SEP)
    return (server, rest) if sep and server and rest else None
