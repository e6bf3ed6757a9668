"""What the rest of the daemon sees of the shared store: the `Shared` port and `Change`.

No driver here: the gateway's services (and the learning and governance features) code
against this port; the composition root hands them a `replica.Replica` when `[store] url`
is set, and nothing otherwise (they keep their state local).

Two shapes of shared data:

- **events** (`append(kind, key, body)`): an append-only log every replica reads in order,
  exactly once each (usage feedback, audit events, catalog change notices);
- **state** (`put(kind, key, body)`): the newest value per (kind, key) (upstream approval
  states, learned weights, card verification results); last writer wins by the writer's clock.

Both are written through the on-disk buffer (durable before `append`/`put` return) and are
idempotent. A subscriber hears every change of its kind made by *another* replica, within
about a second (NOTIFY, with a periodic catch-up for a missed notification).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

# Kinds in use; a new feature picks a new kind (a short dotted name) and says so here.
CATALOG_CHANGED = "catalog.changed"  # event; key: upstream; body: {"hash", "tools"}
CARD = "card"  # state; key: upstream; body: {"sha256", "created_at", "card", "status", "quarantined"}
# Reserved for the features that plug in next (learning, governance issues):
FEEDBACK = "feedback"  # event; key: namespaced tool; body: the feedback event
# event; key: namespaced tool, or "*" for every tool; body: {"tool": str | None, "until": float}
# (`toolatlas learning forget|reset` on any host: every replica deletes those events up to then)
FEEDBACK_FORGET = "feedback.forget"
LEARNED = "learned"  # state; key: namespaced tool; body: its learned weights
AUDIT = "audit"  # event; key: principal or upstream; body: the audit record
APPROVAL = "approval"  # state; key: upstream; body: {"state", "by", "at", "reason"}


@dataclass(frozen=True)
class Change:
    """One shared write as another replica reads it: an event (`seq` is its id) or a state
    value (`seq` is its sequence number)."""

    table: str  # "events" | "state"
    kind: str
    key: str
    body: dict[str, Any]
    origin: str
    seq: int


Handler = Callable[[Change], Awaitable[None]]


class Shared(Protocol):
    """The shared store as features use it; see the module docstring."""

    origin: str  # this replica's name in the store (hostname:pid:random)

    async def append(self, kind: str, key: str, body: dict[str, Any]) -> None:
        """Log an event (durable on local disk when this returns; BufferFull if the buffer is full)."""

    async def put(self, kind: str, key: str, body: dict[str, Any], *, at: float | None = None) -> None:
        """Set the shared value of (kind, key) (durable on local disk when this returns); `at`
        orders it against other writes of that value (default: now by this host's clock)."""

    def subscribe(self, kind: str, handler: Handler) -> None:
        """Call `handler` for each change of `kind` another replica makes (and, for state, for
        the values already there when this replica connects)."""


__all__ = ["APPROVAL", "AUDIT", "CARD", "CATALOG_CHANGED", "FEEDBACK", "FEEDBACK_FORGET", "LEARNED", "Change", "Handler", "Shared"]
