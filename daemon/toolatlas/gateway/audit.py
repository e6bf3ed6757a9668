"""The audit fields every audit event carries (toolatlas.events.AUDIT_FIELDS), from the
connection and the request the current task serves (`ports.REQUEST`, set by the surface), and
when an answered request's bookkeeping runs (`bookkeep`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from toolatlas import access
from toolatlas import events as ev
from toolatlas.gateway.ports import REQUEST, Connection
from toolatlas.metrics import Metrics

# Client-supplied names and versions are cut to this in audit lines.
CLIENT_TEXT_CHARS = 128
# So are a caller's tool names, targets and string request ids, so no line grows with what it sends.
TEXT_CHARS = 200


def shown(text: str, limit: int = TEXT_CHARS) -> str:
    """A caller's name or URI as an error quotes it: whole up to `limit` characters (every
    gateway tool name is), cut past that, so a reply does not grow with what the caller sent."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}..."


def who(conn: Connection) -> dict[str, Any]:
    """`principal`, `user`, `client`, `client_version`, `endpoint`, `connection`, `request`."""
    if conn.oauth is not None:
        user: str | None = conn.oauth.subject
    elif conn.token is None:
        user = access.user_name(conn.uid)
    else:
        user = None
    request = REQUEST.get()
    rid = None if request is None else request.id
    return {
        "principal": conn.principal,
        "user": user,
        "client": _cut(conn.client_name),
        "client_version": _cut(conn.client_version),
        "endpoint": conn.endpoint,
        "connection": conn.id,
        "request": rid[:TEXT_CHARS] if isinstance(rid, str) else rid,
    }


def via() -> str:
    """How the current call came in: "direct" (a namespaced tools/call) or "execute_tool"."""
    request = REQUEST.get()
    return "direct" if request is not None and request.via == "direct" else "execute_tool"


def deny(events: ev.Events, metrics: Metrics, conn: Connection, surface: str, target: str | None,
         reason: str) -> None:
    """One access denial: the `access_denied` audit event and the access_denials counter."""
    metrics.count_denial(surface)
    events.emit(ev.ACCESS_DENIED, surface=surface, target=None if target is None else target[:TEXT_CHARS],
                reason=reason[:ev.MESSAGE_CHARS], **who(conn))


def _cut(text: str | None) -> str | None:
    return None if text is None else text[:CLIENT_TEXT_CHARS]


__all__ = ["TEXT_CHARS", "deny", "via", "who"]


def bookkeep(events: ev.Events, event: str, work: Callable[[], None]) -> None:
    """Run an answered request's bookkeeping (metrics, its `event` line, the learning hook) as
    the event loop's next callback: the answer's write comes first in the task step that built
    it, so this overlaps the caller reading it and still precedes anything the caller does
    next. When `event` goes to an audit trail it runs now, before the answer: a daemon killed
    once the answer is out still has the line."""
    if events.audits(event):
        work()
    else:
        asyncio.get_running_loop().call_soon(work)
